# The study page (streamback/report/): results/study.html from everything the other stages make
# (final_outputs in common.smk) and the merged config.

from pathlib import Path

from streamback import layout

# The files the config was merged from, for the page's provenance (each with its sha256): an untracked
# param, as the merged config itself (tracked) is what the page depends on, and their absolute
# paths would rerun the report in a moved or cloned checkout.
CONFIG_FILES = [str(DEFAULT_CONFIG), *(str(Path(f).resolve()) for f in workflow.overwrite_configfiles)]


# Local rules: under `--profile slurm` they run beside Snakemake, not as Slurm jobs. Each only reads
# what jobs wrote and writes tables, figures or the page (seconds of one CPU, no model), so it waits
# in no queue of its own between the last job and the results (more in eval.smk, train.smk and
# preflight.smk).
localrules:
    seed_variance,
    depth,
    study_report,


# Training's own randomness: every arm's losses and scores over its seeds, and each comparison's
# per-seed differences (streamback/report/seeds.py).
rule seed_variance:
    input:
        benchmarks=str(layout.table("benchmarks")),
        pairs=str(layout.table("benchmark_pairs")),
        loss=str(layout.table("loss_difference")),
        checkpoints=rules.benchmark_table.output.checkpoints,  # eval.last_checkpoints > 1: task_snr.csv's noise
    output:
        table=report(str(layout.table(layout.SEED_TABLE)), caption="../report/seed_variance.rst", category="Seeds"),
        snr=report(str(layout.table(layout.TASK_SNR_TABLE)), caption="../report/task_snr.rst", category="Seeds"),
        figures=[
            report(str(layout.figure(layout.SEED_FIGURE, suffix)), caption="../report/seed_differences.rst", category="Seeds")
            if suffix == "svg" else str(layout.figure(layout.SEED_FIGURE, suffix))
            for suffix in layout.FIGURE_SUFFIXES
        ],
    conda:
        "../../envs/analysis.yaml"
    log:
        "logs/seed_variance.log",
    benchmark:
        str(layout.timing_file("seed_variance")),
    threads: 1
    resources:
        mem_mb=2000,
        runtime=10,
    params:
        train=as_json(jobs.seed_variance(config)["train"]),
        checkpoint_scores=lambda wildcards, input: shell_words(["--checkpoints", *input.checkpoints] if input.checkpoints
                                                         else []),
    shell:
        "streamback seed-variance --params {params.train} {params.checkpoint_scores} > {log:q} 2>&1 || log_tail {log:q}"


# Does the fp32 stream matter more with depth? Every measure per depth from the analyses' tables,
# and its trend against log2(depth) (streamback/report/depth.py).
rule depth:
    input:
        [str(layout.table(name)) for name in ("loss_difference", "layer_error", "swallowed", "envelope")],
    output:
        tables=[report(str(layout.table(name)), caption=f"../report/{name}.rst", category="Depth")
                for name in layout.DEPTH_TABLES],
        figures=[
            report(str(layout.figure(layout.DEPTH_FIGURE, suffix)), caption="../report/depth_figure.rst", category="Depth")
            if suffix == "svg" else str(layout.figure(layout.DEPTH_FIGURE, suffix))
            for suffix in layout.FIGURE_SUFFIXES
        ],
    conda:
        "../../envs/analysis.yaml"
    log:
        "logs/depth.log",
    benchmark:
        str(layout.timing_file("depth")),
    threads: 1
    resources:
        mem_mb=2000,
        runtime=10,
    params:
        config=as_json(jobs.depth(config)),
    shell:
        "streamback depth --config-json {params.config} > {log:q} 2>&1 || log_tail {log:q}"


rule study_report:
    input:
        final_outputs(page=False),
    output:
        report(str(layout.STUDY_PAGE), caption="../report/study_report.rst", category="0. Start here"),
    conda:
        "../../envs/analysis.yaml"
    log:
        "logs/study_report.log",
    benchmark:
        str(layout.timing_file("study_report")),
    threads: 1
    resources:
        mem_mb=2000,
        runtime=10,
    params:
        config=as_json(config),
        files=untracked(shell_words(CONFIG_FILES)),
    shell:
        "streamback study-report --config-json {params.config} --config-files {params.files} --out {output:q} > {log:q} 2>&1 || log_tail {log:q}"

