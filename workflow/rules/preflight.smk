# Preflight: before any run trains, one `preflight_run` job per arm of the matrix (shape, block,
# stream; the seeds of an arm train alike, so its first run stands for them) runs
# `streamback preflight`: a few steps of that run's own training on the same GPUs, nodes, CPUs,
# memory and launcher (torchrun, srun) as its train job, judged check by check
# (streamback/preflight/), in a job of its own time limit (train.preflight.runtime; by default
# sized from its steps). A passed preflight writes results/preflight/{arm}.json and `passed` to
# results/preflight/{arm}.pass (its gate); a failed one fails its job, prints one line per failed
# check and leaves its record in results/preflight/failed/, never at the output. Rule `preflight` (`snakemake preflight`: the preflights alone; also part of
# the default target) puts them in one table and checks the whole matrix's projected cost against
# train.budget_gpu_hours and train.stated_gpu_hours; where either is set, it writes the matrix's
# gate (results/preflight/matrix.pass) once passed, and failed it prints one line (the
# projection, the bound, the costliest arm) and fails. Where neither is set, rule
# preflight_unbounded writes that gate at once.
# Each train job waits for its arm's gate and the matrix's (train_gates in common.smk), so
# nothing trains before its preflight passed, nor before the matrix's projection met its bounds.
# Reruns: a preflight's params hold its run's recipe, execution (micro-batch, compile,
# checkpointing), resources and the software versions, so it reruns when one of them changes and
# not on every call; `snakemake -R preflight_run preflight` forces every one. The train jobs take
# the gates as ancient() inputs (Snakemake removes a job's outputs before it runs, so a gate's
# mtime cannot be kept): a preflight or table run again reruns no training (changing mem_mb,
# compile or one arm retrains nothing else). Snakemake 9.27 weighs no job's own params downstream
# of a job that reruns (its DAG masks them), so a changed recipe retrains through the run's recipe
# file instead (rule train_recipe, not downstream of any preflight).

import platform
import re
from importlib.metadata import version
from pathlib import Path

PREFLIGHT_ARMS = jobs.preflight_arms(config)  # arm -> the run it checks
# the matrix's projection has a bound to meet: rule preflight writes the matrix's gate, else rule preflight_unbounded
MATRIX_BOUNDED = config["train"]["budget_gpu_hours"] is not None or config["train"]["stated_gpu_hours"] is not None
SOFTWARE = {"python": platform.python_version(), "torch": version("torch")}


rule preflight_run:
    input:
        manifest=rules.tokenize.output.manifest,
    output:
        record=str(layout.preflight_file("{arm}")),
        gate=str(layout.preflight_gate("{arm}")),
    conda:
        "../../envs/train.yaml"
    log:
        "logs/preflight/{arm}.log",
    benchmark:
        str(layout.timing_file("preflight", "{arm}")),
    wildcard_constraints:
        arm="|".join(re.escape(arm) for arm in PREFLIGHT_ARMS) or "(?!)",
    threads: of_arm(train_threads)
    resources:
        runtime=preflight_runtime,
        mem_mb=lambda wildcards: train_resources(PREFLIGHT_ARMS[wildcards.arm])["mem_mb"],
        nodes=lambda wildcards: train_resources(PREFLIGHT_ARMS[wildcards.arm])["nodes"],
        gpu=of_arm(train_slurm("gpu")),
        cpus_per_gpu=of_arm(train_slurm("cpus_per_gpu")),
        cpus_per_task=of_arm(train_slurm("cpus_per_task")),
        tasks=of_arm(train_slurm("tasks")),
        mpi=of_arm(train_slurm("mpi")),
        slurm_extra=of_arm(train_slurm("slurm_extra")),
    params:
        train=lambda wildcards: as_json(jobs.preflight(config, wildcards.arm)["train"]),
        model=lambda wildcards: as_json(jobs.preflight(config, wildcards.arm)["model"]),
        resources=lambda wildcards: as_json(train_resources(PREFLIGHT_ARMS[wildcards.arm])),
        software=as_json(SOFTWARE),
        launch=untracked(of_arm(train_launcher)),
        threads=untracked(lambda wildcards: train_resources(PREFLIGHT_ARMS[wildcards.arm])["threads"]),
        tokens=lambda wildcards, input: Path(input.manifest).parent,
        checkpoints=lambda wildcards: layout.checkpoint_dir(PREFLIGHT_ARMS[wildcards.arm]),
    shell:
        "{params.launch} preflight --params {params.train} --model-params {params.model} --arm {wildcards.arm:q} "
        "--data {params.tokens:q} --checkpoints {params.checkpoints:q} --resources {params.resources} --out {output.record:q} "
        "--gate {output.gate:q} "
        "--threads {params.threads:q} > {log:q} 2>&1 || log_tail {log:q}"


# Local (see report.smk): the table of the preflights' records, whose gate the train jobs wait for, is
# written as soon as the last preflight ends, not after a queue wait of its own.
localrules:
    preflight,


rule preflight:
    input:
        records=expand(rules.preflight_run.output.record, arm=list(PREFLIGHT_ARMS)),
    output:
        table=report(str(layout.table(layout.PREFLIGHT_TABLE)), caption="../report/preflights.rst", category="Preflight"),
        gate=[str(layout.PREFLIGHT_MATRIX_GATE)] if MATRIX_BOUNDED else [],
    conda:
        "../../envs/analysis.yaml"
    log:
        "logs/preflight.log",
    benchmark:
        str(layout.timing_file("preflight")),
    threads: 1
    resources:
        mem_mb=2000,
        runtime=10,
    params:
        train=as_json(jobs.preflight_table(config)["train"]),
        gate=lambda wildcards, output: shell_words(["--gate", *output.gate] if output.gate else []),
        # what the whole matrix's peak disk is made of (streamback/preflight/table.py's matrix_disk)
        disk=as_json(jobs.preflight_disk(config)),
    shell:
        "streamback preflight-table --params {params.train} --records {input.records:q} --out {output.table:q} {params.gate} "
        "--disk-config {params.disk} > {log:q} 2>&1 || log_tail {log:q}"


if not MATRIX_BOUNDED:

    localrules:
        preflight_unbounded,

    # No budget and no stated cost: the matrix has no bound to check, so its gate passes at once and a
    # train job waits for its own arm's preflight alone (not for every arm's, nor for the table).
    rule preflight_unbounded:
        output:
            gate=str(layout.PREFLIGHT_MATRIX_GATE),
        conda:
            "../../envs/analysis.yaml"
        log:
            "logs/preflight_unbounded.log",
        threads: 1
        resources:
            mem_mb=100,
            runtime=1,
        shell:
            "printf 'passed\\n' > {output.gate:q} 2> {log:q}"


