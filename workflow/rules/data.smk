# Data: the synthetic corpus (rule corpus) and text -> token shards (rule tokenize).
# Outputs: results/corpus/<corpus>/part-*.parquet (synthetic source only) and
# results/tokens/<corpus>/ (or data.dir): shards, tokenizer.json and manifest.json, the output
# the training rules depend on (rules.tokenize.output.manifest).

from streamback import layout
from streamback.layout import corpus_dir, corpus_files, input_files, tokens_dir

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
    resources:
        mem_mb=2000,
        runtime=30,
    params:
        cfg=params_json("data"),
        out=str(corpus_dir(DATA)),
    shell:
        "{STREAMBACK} corpus --params {params.cfg} --out {params.out} --processes {threads} > {log} 2>&1"


# Shards of an interrupted run are not outputs, so Snakemake keeps them and a rerun resumes.
rule tokenize:
    input:
        [str(path) for path in input_files(DATA)],
    output:
        manifest=report(f"{TOKENS}/manifest.json", caption="../report/data_manifest.rst", category="Data"),
    conda:
        "../../envs/data.yaml"
    log:
        f"logs/tokenize/{DATA['corpus']}.log",
    benchmark:
        str(layout.timing_file("tokenize")),
    threads: DATA["processes"]
    resources:
        mem_mb=DATA["mem_mb"],
        runtime=DATA["runtime"],
    params:
        cfg=params_json("data"),
        out=TOKENS,
    shell:
        "{STREAMBACK} tokenize --params {params.cfg} --out {params.out} --processes {threads} --inputs {input} > {log} 2>&1"


TARGETS.append(rules.tokenize.output.manifest)
