# Evaluation: lm-evaluation-harness on every trained run (streamback/eval/).
# eval_tasks writes the items of the local tasks of eval.tasks (the offline default's, drawn from
# the corpus generator with eval.local.seed); evaluate runs one job per run of the train.runs
# matrix (`streamback evaluate`: the `streamback` lm-eval model, as trained); benchmark_table
# aggregates them and tests each run against its shape's baseline.
# Outputs (streamback/layout.py): results/eval/tasks/<task>.jsonl, results/eval/{run}/results.json
# (lm-eval's own, written last) and samples_<task>.jsonl, results/tables/benchmarks.csv and
# benchmark_pairs.csv.

import re
import shlex
from pathlib import Path

from streamback import layout
from streamback.eval.taskdata import LOCAL_TASKS
from streamback.runs import run_matrix

EVAL = config["eval"]
EVAL_RES = EVAL["resources"]
EVAL_RUNS = list(run_matrix(config["train"]))
LOCAL_TASK_FILES = [str(layout.eval_task_file(task)) for task in EVAL["tasks"] if task in LOCAL_TASKS]


def corpus_seed():
    """The training corpus's seed, which the local tasks' items must avoid (synthetic corpus only)."""
    return f"--corpus-seed {config['data']['synthetic']['seed']}" if config["data"]["source"] == "synthetic" else ""


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
        cfg=params_json("eval"),
        seed=corpus_seed(),
    shell:
        "{STREAMBACK} eval-tasks --params {params.cfg} {params.seed} > {log} 2>&1"


rule evaluate:
    input:
        model=rules.train.output.model,
        manifest=rules.tokenize.output.manifest,
        tasks=LOCAL_TASK_FILES,
    output:
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
        mem_mb=EVAL_RES["mem_mb"],
        runtime=EVAL_RES["runtime"],
        gpu=EVAL_RES["gpus"] or None,
        cpus_per_gpu=EVAL_RES["threads"] if EVAL_RES["gpus"] else None,
    params:
        cfg=params_json("eval"),
        tokens=lambda wildcards, input: shlex.quote(str(Path(input.manifest).parent)),
        outdir=lambda wildcards: layout.eval_dir(wildcards.run),
    shell:
        "OMP_NUM_THREADS={threads} {STREAMBACK} evaluate --params {params.cfg} --run-name {wildcards.run} --model {input.model} "
        "--tokens {params.tokens} --outdir {params.outdir} --threads {threads} > {log} 2>&1"


rule benchmark_table:
    input:
        expand(rules.evaluate.output.results, run=EVAL_RUNS),
        expand(rules.evaluate.output.samples, run=EVAL_RUNS),
    output:
        benchmarks=report(str(layout.table("benchmarks")), caption="../report/benchmarks.rst", category="Evaluation"),
        pairs=report(str(layout.table("benchmark_pairs")), caption="../report/benchmark_pairs.rst", category="Evaluation"),
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
        cfg=params_json("eval"),
        train=params_json("train"),
    shell:
        "{STREAMBACK} benchmark-table --params {params.cfg} --train-params {params.train} > {log} 2>&1"


TARGETS.extend(rules.benchmark_table.output)
