# Training: one job per run of the matrix in config["train"]["runs"] (streamback/runs.py), each
# `streamback train` on the tokenized corpus (rules.tokenize), once its arm's preflight passed
# and the matrix's projection (against train.budget_gpu_hours; train_gates, preflight.smk).
# Its recipe reaches it as results/runs/{run}/recipe.json (rule train_recipe), so a changed
# recipe retrains it even in a call where a preflight reruns.
# Outputs (streamback/layout.py): results/runs/{run}/model.pt (the trained model,
# streamback/model/weights.py), metrics.jsonl (one record per step) with metrics.header.json beside
# it (the kernels the run computed on), and summary.json (the completion record); with
# eval.last_checkpoints k > 1 also last/step_<N>.pt, the models at the k-1 earlier steps that the
# evaluate job scores beside the final one (SNAPSHOT_STEPS, the Snakefile's; kept in the recipe
# directory until the run ends, so a resumed run still ends with all of them).
# Checkpoints and the live metrics.jsonl go to results/checkpoints/{run}/recipe-<fingerprint>/, one
# directory per recipe, which is not an output: Snakemake never deletes it when a job fails, and
# rerunning the rule (a retry, a requeue, a new `snakemake` call, `-R train`) resumes from the
# newest checkpoint of the job's recipe; a changed recipe starts in a directory of its own.
#
# Launch, per run, from config["train"]["resources"] (merged with train.per_run[run].resources):
#   gpus 0, processes 1, nodes 1   one CPU process: python -m streamback train ...
#   gpus G (or processes P on the CPU), nodes 1
#                     torchrun --standalone with G (P) processes (Slurm: a single task step)
#   ... nodes N       srun starts one torchrun per node (N tasks of G GPUs or P CPU processes),
#                     the rendezvous host being the job's first node; see train_launcher and
#                     train_slurm in common.smk.
# torchrun forwards SIGTERM and SIGUSR1 to the trainers (PET_SIGNALS_TO_HANDLE) and waits up to
# TORCH_ELASTIC_SHUTDOWN_TIMEOUT seconds for them to save a checkpoint before killing them.
# Each attempt is `streamback train-attempt` (streamback/train/attempt.py): it starts the trainer
# with the run's launcher, appends the attempt to the run's history (results/checkpoints/{run}/
# train.log, kept with the checkpoints; logs/train/{run}.log is a hard link to it) and exits with
# the trainer's own status (75: stopped to be requeued, 3: diverged, 2: bad input) where torchrun
# reports another. The rule's shell outlives the SIGTERM/SIGUSR1 that Slurm sends every process
# of a job (`trap :`), as the attempt does, so the status reaches Snakemake. Slurm sends SIGURG
# `signal_lead` seconds before the time limit (slurm_extra's --signal=URG@<s>: train_slurm_extra
# in common.smk), which every process but the trainers ignores; the trainers save and stop on it.

import re
from pathlib import Path

from streamback.runs import run_matrix

TRAIN = config["train"]
RUNS = run_matrix(TRAIN)


# Local rules (see report.smk): the recipe file and the curves' table and figures.
localrules:
    train_recipe,
    training_curves,


# The settings a run trains with, as its train job is given them (a file of seconds: no Slurm job).
rule train_recipe:
    output:
        recipe=str(layout.recipe_file("{run}")),
    conda:
        "../../envs/analysis.yaml"
    log:
        "logs/train_recipe/{run}.log",
    wildcard_constraints:
        run="|".join(re.escape(run) for run in RUNS) or "(?!)",
    threads: 1
    resources:
        mem_mb=100,
        runtime=1,
    params:
        train=train_settings("train"),
        model=train_settings("model"),
    shell:
        """printf '{{"train": %s, "model": %s}}\\n' {params.train} {params.model} > {output.recipe:q} 2> {log:q}"""


rule train:
    input:
        manifest=rules.tokenize.output.manifest,
        gates=train_gates,
        recipe=rules.train_recipe.output.recipe,
    output:
        model=str(layout.model_file("{run}")),
        metrics=str(layout.metrics_file("{run}")),
        metrics_header=str(layout.metrics_header_file("{run}")),
        summary=str(layout.summary_file("{run}")),
        snapshots=[str(layout.snapshot_file("{run}", step)) for step in SNAPSHOT_STEPS],
    conda:
        "../../envs/train.yaml"
    log:
        "logs/train/{run}.log",
    benchmark:
        str(layout.timing_file("train", "{run}")),
    wildcard_constraints:
        run="|".join(re.escape(run) for run in RUNS) or "(?!)",
    threads: train_threads
    retries: TRAIN["resources"]["retries"] or None  # 0: Snakemake's --retries (a rule's 0 would mean none)
    resources:
        runtime=lambda wildcards: train_resources(wildcards.run)["runtime"],
        mem_mb=lambda wildcards: train_resources(wildcards.run)["mem_mb"],
        nodes=lambda wildcards: train_resources(wildcards.run)["nodes"],
        gpu=train_slurm("gpu"),
        cpus_per_gpu=train_slurm("cpus_per_gpu"),
        cpus_per_task=train_slurm("cpus_per_task"),
        tasks=train_slurm("tasks"),
        mpi=train_slurm("mpi"),
        slurm_extra=train_slurm_extra,
    params:
        train=train_settings("train"),
        model=train_settings("model"),
        execution=untracked(lambda wildcards: as_json(jobs.train_execution(config, wildcards.run)["train"])),
        launch=untracked(train_launcher),
        threads=untracked(lambda wildcards: train_resources(wildcards.run)["threads"]),
        snapshots=untracked(shell_words(["--snapshot-steps", *SNAPSHOT_STEPS] if SNAPSHOT_STEPS else [])),
        tokens=lambda wildcards, input: Path(input.manifest).parent,
        outdir=lambda wildcards, output: Path(output.model).parent,
        checkpoints=lambda wildcards: layout.checkpoint_dir(wildcards.run),
        history=lambda wildcards: layout.train_log(wildcards.run),
    shell:
        "trap : TERM USR1; streamback train-attempt --launch {params.launch:q} --checkpoints {params.checkpoints:q} "
        "--history {params.history:q} --log {log:q} -- --params {params.train} --model-params {params.model} "
        "--execution {params.execution} --run-name {wildcards.run:q} --data {params.tokens:q} --outdir {params.outdir:q} "
        "--threads {params.threads:q} {params.snapshots}"



# The runs' curves, from their metrics.jsonl: a table and figures (streamback/train/curves.py).
rule training_curves:
    input:
        expand(rules.train.output.metrics, run=list(RUNS)),
    output:
        table=report(str(layout.table(layout.TRAINING_TABLE)), caption="../report/training_curves.rst", category="Training"),
        figures=[
            report(str(layout.figure(name, suffix)), caption=f"../report/{name}.rst", category="Training") if suffix == "svg"
            else str(layout.figure(name, suffix))
            for name in layout.TRAINING_FIGURES for suffix in layout.FIGURE_SUFFIXES
        ],
    conda:
        "../../envs/analysis.yaml"
    log:
        "logs/training_curves.log",
    benchmark:
        str(layout.timing_file("training_curves")),
    threads: 1
    resources:
        mem_mb=2000,
        runtime=10,
    params:
        train=as_json(jobs.training_curves(config)["train"]),
        runs=shell_words(RUNS),
    shell:
        "streamback training-curves --params {params.train} --runs {params.runs} > {log:q} 2>&1 || log_tail {log:q}"

