# Fetch: everything the study reads from the Hugging Face Hub, into the config's hub_cache
# (`streamback fetch`, streamback/fetch/stage.py): the hub dataset's files at the commit
# data.hub.revision resolves to, the hub tokenizer, the eval tasks' hub datasets. Local: it runs
# where Snakemake runs (the login node, which reaches the Hub); every other job reads the cache
# alone, offline (streamback/data/hubcache.py). Run it by name, `snakemake fetch`, before the
# study: no rule asks for its record, so a config whose data are local (the default) plans none.
# Output: results/fetch/fetched.json, what was fetched and its commits.


localrules:
    fetch,


rule fetch:
    output:
        record=str(layout.FETCH_RECORD),
    conda:
        "../../envs/eval.yaml"
    log:
        "logs/fetch.log",
    threads: 1
    resources:
        mem_mb=4000,
        runtime=600,
    params:
        data=as_json(jobs.fetch(config)["data"]),
        eval=as_json(jobs.fetch(config)["eval"]),
        cache=untracked(str(Path(config["hub_cache"]).resolve())),
    shell:
        "streamback fetch --data {params.data} --eval {params.eval} --cache {params.cache:q} --out {output.record:q} "
        "> {log:q} 2>&1 || log_tail {log:q}"
