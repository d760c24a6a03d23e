# Data: the synthetic corpus (rule corpus) and text -> token shards (rule tokenize).
# Outputs: results/corpus/<corpus>/part-*.parquet (synthetic source only) and
# results/tokens/<corpus>/ (or data.dir): shards, tokenizer.json and manifest.json, the output
# the training rules depend on (rules.tokenize.output.manifest).

from streamback.layout import corpus_files, input_files, tokens_dir

DATA = config["data"]
TOKENS = str(tokens_dir(DATA))


rule corpus:
    output:
        [str(path) for path in corpus_files(DATA)],
    conda:
        "../../envs/data.yaml"
    log:
        f"logs/corpus/{DATA['corpus']}.log",
    benchmark:
        str(layout.timing_file("corpus")),
    threads: DATA["processes"]
    priority: 1  # the corpus and its tokens gate every train job: before drift, which nothing waits for until the report
    resources:
        mem_mb=2000,
        runtime=30,
    params:
        data=as_json(jobs.corpus(config)["data"]),
        out=lambda wildcards, output: Path(output[0]).parent,
    shell:
        "streamback corpus --params {params.data} --out {params.out:q} --processes {threads} > {log:q} 2>&1 || log_tail {log:q}"


# Shards of an interrupted run are not outputs, so Snakemake keeps them and a rerun resumes.
rule tokenize:
    input:
        files=[str(path) for path in input_files(DATA)],
        fetched=fetched("data"),  # a hub dataset or tokenizer: fetched first (fetch.smk)
    output:
        manifest=report(f"{TOKENS}/manifest.json", caption="../report/data_manifest.rst", category="Data"),
    conda:
        "../../envs/data.yaml"
    log:
        f"logs/tokenize/{DATA['corpus']}.log",
    benchmark:
        str(layout.timing_file("tokenize")),
    threads: DATA["processes"]
    priority: 1
    resources:
        mem_mb=DATA["mem_mb"],
        runtime=DATA["runtime"],
    params:
        data=as_json(jobs.tokenize(config)["data"]),
        execution=untracked(as_json(jobs.tokenize_execution(config)["data"])),
        out=lambda wildcards, output: Path(output.manifest).parent,
    shell:
        "streamback tokenize --params {params.data} --execution {params.execution} --out {params.out:q} --processes {threads} "
        "--inputs {input.files:q} > {log:q} 2>&1 || log_tail {log:q}"

