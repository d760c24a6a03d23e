# Fetch: everything the study reads from the Hugging Face Hub, into the config's hub_cache
# (`streamback fetch`, streamback/fetch/stage.py): fetch_data takes the hub dataset's files at the
# commit data.hub.revision resolves to and the hub tokenizer (tokenize waits for it), fetch_tasks
# the hub datasets of eval.tasks (evaluate waits for it). Local rules: they run where Snakemake
# runs (the login node, which reaches the Hub); every other job reads the cache alone, offline
# (streamback/data/hubcache.py). `snakemake fetch` (the Snakefile's rule fetch) runs both alone.
# A config that reads nothing from the Hub (the default) plans neither. Each is given only what
# it downloads, and a change there reruns its consumers anyway (new shards, new tasks), so a
# fetch never reruns a job that would not rerun without it.
# Outputs: results/fetch/data.json and tasks.json, what was fetched and its commits.

FETCH_CACHE = str(Path(config["hub_cache"]).resolve())


localrules:
    fetch_data,
    fetch_tasks,


rule fetch_data:
    output:
        record=str(layout.fetch_record("data")),
    conda:
        "../../envs/eval.yaml"
    log:
        "logs/fetch/data.log",
    threads: 1
    resources:
        mem_mb=4000,
        runtime=600,
    params:
        data=as_json(jobs.fetch(config, "data")["data"]),
        cache=untracked(FETCH_CACHE),
        out=lambda wildcards, output: Path(output.record).parent,
    shell:
        "streamback fetch --parts data --data {params.data} --cache {params.cache:q} --out {params.out:q} "
        "> {log:q} 2>&1 || log_tail {log:q}"


rule fetch_tasks:
    output:
        record=str(layout.fetch_record("tasks")),
    conda:
        "../../envs/eval.yaml"
    log:
        "logs/fetch/tasks.log",
    threads: 1
    resources:
        mem_mb=4000,
        runtime=600,
    params:
        eval=as_json(jobs.fetch(config, "tasks")["eval"]),
        cache=untracked(FETCH_CACHE),
        out=lambda wildcards, output: Path(output.record).parent,
    shell:
        "streamback fetch --parts tasks --eval {params.eval} --cache {params.cache:q} --out {params.out:q} "
        "> {log:q} 2>&1 || log_tail {log:q}"
