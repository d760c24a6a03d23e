# Analyses of the trained runs (streamback/analysis/): one job per kind over every run of the
# train.runs matrix (`streamback analyze <kind>`), on one validation batch of the runs' own data.
# Outputs (streamback/layout.py: ANALYSIS_TABLES, analysis_figures): results/tables/{layer_error,
# envelope, envelope_training, swallowed, loss_difference, loss_curves}.csv and
# results/figures/<figure>.{svg,png}: per run layer_error-<run> and envelope_training-<run>, one
# envelope, per shape swallowed-<shape> and loss_difference-<shape>.
# Resources from config["analysis"]["resources"]: gpus 0 runs on the CPU, 1 asks Slurm for a GPU.

import shlex
from pathlib import Path

from streamback import layout
from streamback.runs import comparisons

ANALYSIS = config["analysis"]
ANALYSIS_RES = ANALYSIS["resources"]
ANALYSIS_RUNS = list(RUNS)  # rule train's matrix
ANALYSIS_SHAPES = list(dict.fromkeys(spec.shape for spec in RUNS.values()))
COMPARED = comparisons(RUNS)  # (shape, baseline, other)
COMPARED_RUNS = list(dict.fromkeys(run for _, *pair in COMPARED for run in pair))
COMPARED_SHAPES = list(dict.fromkeys(shape for shape, _, _ in COMPARED))
CAPTIONS = {  # table or figure name (less its run or shape) -> caption file
    "layer_error": "analysis_layer_error", "envelope": "analysis_envelope", "envelope_training": "analysis_envelope_training",
    "swallowed": "analysis_swallowed", "loss_difference": "analysis_loss_difference", "loss_curves": "analysis_loss_curves",
}


def analysis_output(kind, runs, shapes):
    """The kind's outputs (layout.analysis_outputs), each table and SVG marked for the report with its caption."""
    marked = []
    for path in layout.analysis_outputs(kind, runs, shapes):
        name, _, key = path.stem.partition("-")
        figure = "figure" if path.suffix != ".csv" else "table"
        if path.suffix == ".png":
            marked.append(str(path))
            continue
        labels = {"analysis": kind, figure: name, **({"run or shape": key} if key else {})}
        marked.append(report(str(path), caption=f"../report/{CAPTIONS[name]}{'_figure' if figure == 'figure' else ''}.rst",
                             category="Analyses", subcategory=kind, labels=labels))
    return marked


def analysis_rule_inputs(runs, metrics):
    inputs = {"manifest": rules.tokenize.output.manifest, "models": [str(layout.model_file(r)) for r in runs]}
    if metrics:
        inputs["metrics"] = [str(layout.metrics_file(r)) for r in runs]
    return inputs


ANALYSIS_SHELL = (
    "OMP_NUM_THREADS={threads} {STREAMBACK} analyze {params.kind} --params {params.cfg} --train-params {params.train} "
    "--data {params.data} --runs {params.runs} --device {params.device} --threads {threads} > {log} 2>&1"
)


def analysis_params(kind, runs):
    return {
        "kind": kind,
        "cfg": params_json("analysis"),
        "train": params_json("train"),
        "data": lambda wildcards, input: shlex.quote(str(Path(input.manifest).parent)),
        "runs": " ".join(shlex.quote(r) for r in runs),
        "device": "cuda" if ANALYSIS_RES["gpus"] else "cpu",
    }


def analysis_resources():
    return {
        "mem_mb": ANALYSIS_RES["mem_mb"],
        "runtime": ANALYSIS_RES["runtime"],
        "gpu": ANALYSIS_RES["gpus"] or None,
        "cpus_per_gpu": ANALYSIS_RES["threads"] if ANALYSIS_RES["gpus"] else None,
    }


rule analyze_layer_error:
    input:
        **analysis_rule_inputs(ANALYSIS_RUNS, metrics=False),
    output:
        analysis_output("layer-error", ANALYSIS_RUNS, ANALYSIS_SHAPES),
    conda:
        "../../envs/analysis.yaml"
    log:
        "logs/analysis/layer-error.log",
    benchmark:
        str(layout.timing_file("analyze_layer_error")),
    threads: ANALYSIS_RES["threads"]
    resources:
        **analysis_resources(),
    params:
        **analysis_params("layer-error", ANALYSIS_RUNS),
    shell:
        ANALYSIS_SHELL


rule analyze_envelope:
    input:
        **analysis_rule_inputs(ANALYSIS_RUNS, metrics=True),
    output:
        analysis_output("envelope", ANALYSIS_RUNS, ANALYSIS_SHAPES),
    conda:
        "../../envs/analysis.yaml"
    log:
        "logs/analysis/envelope.log",
    benchmark:
        str(layout.timing_file("analyze_envelope")),
    threads: ANALYSIS_RES["threads"]
    resources:
        **analysis_resources(),
    params:
        **analysis_params("envelope", ANALYSIS_RUNS),
    shell:
        ANALYSIS_SHELL


rule analyze_swallowed:
    input:
        **analysis_rule_inputs(ANALYSIS_RUNS, metrics=False),
    output:
        analysis_output("swallowed", ANALYSIS_RUNS, ANALYSIS_SHAPES),
    conda:
        "../../envs/analysis.yaml"
    log:
        "logs/analysis/swallowed.log",
    benchmark:
        str(layout.timing_file("analyze_swallowed")),
    threads: ANALYSIS_RES["threads"]
    resources:
        **analysis_resources(),
    params:
        **analysis_params("swallowed", ANALYSIS_RUNS),
    shell:
        ANALYSIS_SHELL


rule analyze_loss_difference:
    input:
        **analysis_rule_inputs(COMPARED_RUNS, metrics=True),
    output:
        analysis_output("loss-difference", COMPARED_RUNS, COMPARED_SHAPES),
    conda:
        "../../envs/analysis.yaml"
    log:
        "logs/analysis/loss-difference.log",
    benchmark:
        str(layout.timing_file("analyze_loss_difference")),
    threads: ANALYSIS_RES["threads"]
    resources:
        **analysis_resources(),
    params:
        **analysis_params("loss-difference", COMPARED_RUNS),
    shell:
        ANALYSIS_SHELL


TARGETS.extend(rules.analyze_layer_error.output + rules.analyze_envelope.output + rules.analyze_swallowed.output)
if COMPARED:  # a matrix without a baseline, or without anything beside it, has no loss difference
    TARGETS.extend(rules.analyze_loss_difference.output)
