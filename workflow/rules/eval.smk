# Evaluation: lm-evaluation-harness on every trained run (streamback/eval/).
# eval_tasks writes the items of the local tasks of eval.tasks (the offline default's, drawn from
# the corpus generator with eval.local.seed); evaluate runs one job per run of the train.runs
# matrix (`streamback evaluate`: the `streamback` lm-eval model, as trained); benchmark_table
# aggregates them and tests each run against its shape's baseline.
# Outputs (streamback/layout.py): results/eval/tasks/<task>.jsonl, results/eval/{run}/results.json
# (lm-eval's own, written last) and samples_<task>.jsonl, results/tables/benchmarks.csv and
# benchmark_pairs.csv. With eval.last_checkpoints k > 1 each evaluate job also scores the run's
# k-1 earlier models (rules.train.output.snapshots) in the same process, into
# results/eval/{run}/checkpoints.csv, and benchmark_table gathers them into
# results/tables/benchmark_checkpoints.csv.

import re
from pathlib import Path

from streamback.eval.taskdata import LOCAL_TASKS
from streamback.runs import run_matrix

EVAL = config["eval"]
EVAL_RES = EVAL["resources"]
EVAL_RUNS = list(run_matrix(config["train"]))
LOCAL_TASK_FILES = [str(layout.eval_task_file(task)) for task in EVAL["tasks"] if task in LOCAL_TASKS]
# the local tasks' items must avoid the training corpus's seed (synthetic corpus only)
CORPUS_SEED = shell_words(["--corpus-seed", config["data"]["synthetic"]["seed"]] if config["data"]["source"] == "synthetic" else [])


# Local rules (see report.smk): the task files (items drawn from the corpus's grammar) and the tables.
localrules:
    eval_tasks,
    benchmark_table,


rule eval_tasks:
    output:
        LOCAL_TASK_FILES,
    conda:
        "../../envs/eval.yaml"
    log:
        "logs/eval/tasks.log",
    benchmark:
        str(layout.timing_file("eval_tasks")),
    threads: 1
    resources:
        mem_mb=1000,
        runtime=10,
    params:
        eval=as_json(jobs.eval_tasks(config)["eval"]),
        seed=CORPUS_SEED,
    shell:
        "streamback eval-tasks --params {params.eval} {params.seed} > {log:q} 2>&1 || log_tail {log:q}"


rule evaluate:
    input:
        model=rules.train.output.model,
        manifest=rules.tokenize.output.manifest,
        tasks=LOCAL_TASK_FILES,
        snapshots=rules.train.output.snapshots,
        fetched=fetched("tasks"),  # tasks whose data are on the Hub: fetched first (fetch.smk)
    output:
        checkpoints=[str(layout.eval_checkpoints("{run}"))] if SNAPSHOT_STEPS else [],
        results=report(str(layout.eval_results("{run}")), caption="../report/eval_results.rst", category="Evaluation", subcategory="{run}"),
        samples=[str(layout.eval_samples("{run}", task)) for task in EVAL["tasks"]],
    conda:
        "../../envs/eval.yaml"
    log:
        "logs/evaluate/{run}.log",
    benchmark:
        str(layout.timing_file("evaluate", "{run}")),
    wildcard_constraints:
        run="|".join(re.escape(run) for run in EVAL_RUNS) or "(?!)",
    threads: EVAL_RES["threads"]
    resources:
        mem_mb=lambda wildcards: sizes.evaluate_job(config, RUNS[wildcards.run].shape, SIZE_VOCAB)["mem_mb"],
        runtime=EVAL_RES["runtime"],
        gpu=EVAL_RES["gpus"] or None,
        cpus_per_gpu=EVAL_RES["threads"] if EVAL_RES["gpus"] else None,
    params:
        eval=as_json(jobs.evaluate(config)["eval"]),
        tokens=lambda wildcards, input: Path(input.manifest).parent,
        snapshots=lambda wildcards, input: shell_words(["--snapshots", *input.snapshots] if input.snapshots else []),
        outdir=lambda wildcards, output: Path(output.results).parent,
    shell:
        "OMP_NUM_THREADS={threads} streamback evaluate --params {params.eval} --run-name {wildcards.run:q} --model {input.model:q} "
        "--tokens {params.tokens:q} {params.snapshots} --outdir {params.outdir:q} --threads {threads} > {log:q} 2>&1 || log_tail {log:q}"


rule benchmark_table:
    input:
        expand(rules.evaluate.output.results, run=EVAL_RUNS),
        expand(rules.evaluate.output.samples, run=EVAL_RUNS),
        expand(rules.evaluate.output.checkpoints, run=EVAL_RUNS),
    output:
        benchmarks=report(str(layout.table("benchmarks")), caption="../report/benchmarks.rst", category="Evaluation"),
        pairs=report(str(layout.table("benchmark_pairs")), caption="../report/benchmark_pairs.rst", category="Evaluation"),
        checkpoints=[str(layout.table(layout.CHECKPOINT_TABLE))] if SNAPSHOT_STEPS else [],
    conda:
        "../../envs/eval.yaml"
    log:
        "logs/eval/benchmark_table.log",
    benchmark:
        str(layout.timing_file("benchmark_table")),
    threads: 1
    resources:
        mem_mb=2000,
        runtime=30,
    params:
        eval=as_json(jobs.benchmark_table(config)["eval"]),
        train=as_json(jobs.benchmark_table(config)["train"]),
    shell:
        "streamback benchmark-table --params {params.eval} --train-params {params.train} > {log:q} 2>&1 || log_tail {log:q}"

