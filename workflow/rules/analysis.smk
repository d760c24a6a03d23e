# Analyses of the trained runs (streamback/analysis/): one job per kind over every run of the
# train.runs matrix (`streamback analyze <kind>`), on one validation batch of the runs' own data.
# Outputs (streamback/layout.py: ANALYSIS_TABLES, analysis_figures): results/tables/{layer_error,
# envelope, envelope_training, swallowed, loss_difference, loss_curves, loss_accumulation}.csv and
# results/figures/<figure>.{svg,png}: per run layer_error-<run> and envelope_training-<run>, one
# envelope, per shape swallowed-<shape> and loss_difference-<shape>.
# Resources from config["analysis"]["resources"]: gpus 0 runs on the CPU, 1 asks Slurm for a GPU; memory and
# time limits from each job's size (streamback/sizes.py) where the config leaves them null.

from streamback.config import public_models
from streamback.runs import comparisons

ANALYSIS_RES = config["analysis"]["resources"]
# the vocabulary the jobs are sized for (streamback/sizes.py): the corpus's once tokenized
SIZE_VOCAB = sizes.vocab_of(config)
ANALYSIS_RUNS = list(RUNS)  # rule train's matrix
ANALYSIS_SHAPES = list(dict.fromkeys(spec.shape for spec in RUNS.values()))
COMPARED = comparisons(RUNS)  # (shape, baseline, other)
COMPARED_RUNS = list(dict.fromkeys(run for _, *pair in COMPARED for run in pair))
COMPARED_SHAPES = list(dict.fromkeys(shape for shape, _, _ in COMPARED))
ANALYSIS_SHELL = (
    "OMP_NUM_THREADS={threads} streamback analyze {params.kind:q} --params {params.analysis} --train-params {params.train} "
    "--data {params.tokens:q} --runs {params.runs} --device {params.device:q} --threads {threads} > {log:q} 2>&1 || log_tail {log:q}"
)


# One rule per kind, alike but for its runs and whether it reads the runs' metrics logs.
ANALYSES = {  # kind: (runs, shapes, reads metrics.jsonl)
    "layer-error": (ANALYSIS_RUNS, ANALYSIS_SHAPES, False),
    "envelope": (ANALYSIS_RUNS, ANALYSIS_SHAPES, True),
    "swallowed": (ANALYSIS_RUNS, ANALYSIS_SHAPES, False),
    "loss-difference": (COMPARED_RUNS, COMPARED_SHAPES, True),
}
for kind, (kind_runs, kind_shapes, metrics) in ANALYSES.items():
    rule_name = f"analyze_{kind.replace('-', '_')}"

    rule:
        name:
            rule_name
        input:
            **analysis_inputs(kind_runs, metrics=metrics),
        output:
            analysis_output(kind, kind_runs, kind_shapes),
        conda:
            "../../envs/analysis.yaml"
        log:
            f"logs/analysis/{kind}.log",
        benchmark:
            str(layout.timing_file(rule_name)),
        threads: ANALYSIS_RES["threads"]
        resources:
            **analysis_resources(kind),
        params:
            **analysis_params(kind, kind_runs),
        shell:
            ANALYSIS_SHELL


# The paper's first evidence on public models (analysis.public_models: a name -> a local Hugging
# Face directory): `streamback analyze public`, tables public_layer_error, public_swallowed,
# public_flip_ratio and per model the figures public_activations-<name> and public_gradients-<name>.
# A model the study exports itself (rule export_hf, results/hf/<run>) needs no download.
PUBLIC_MODELS = public_models(config["analysis"])
PUBLIC_SHELL = ANALYSIS_SHELL.replace("--runs {params.runs} ", "")  # its models are analysis.public_models


rule export_hf:
    input:
        manifest=rules.tokenize.output.manifest,
        model=str(layout.model_file("{run}")),
    output:
        [str(path) for path in layout.hf_files("{run}")],
    conda:
        "../../envs/analysis.yaml"
    log:
        "logs/export_hf/{run}.log",
    benchmark:
        str(layout.timing_file("export_hf", "{run}")),
    threads: 1
    resources:  # from the model's size (streamback/sizes.py), or analysis.export_resources
        mem_mb=lambda wildcards: sizes.export_job(config, RUNS[wildcards.run].shape, SIZE_VOCAB)["mem_mb"],
        runtime=lambda wildcards: sizes.export_job(config, RUNS[wildcards.run].shape, SIZE_VOCAB)["runtime"],
    wildcard_constraints:
        run="|".join(re.escape(run) for run in RUNS) or "(?!)",
    params:
        out=lambda wildcards: layout.hf_dir(wildcards.run),
        tokens=lambda wildcards, input: Path(input.manifest).parent,
    shell:
        "streamback export-hf --checkpoint {input.model:q} --out {params.out:q} --data {params.tokens:q} > {log:q} 2>&1 || log_tail {log:q}"


rule analyze_public:
    input:
        manifest=rules.tokenize.output.manifest,
        models=[str(Path(directory) / "config.json") for directory in PUBLIC_MODELS.values()],
        tokenizers=[str(Path(directory) / "tokenizer.json") for directory in PUBLIC_MODELS.values()],
    output:
        analysis_output("public", list(PUBLIC_MODELS), []),
    conda:
        "../../envs/analysis.yaml"
    log:
        "logs/analysis/public.log",
    benchmark:
        str(layout.timing_file("analyze_public")),
    threads: ANALYSIS_RES["threads"]
    resources:
        **analysis_resources("public"),
    params:
        **analysis_params("public", []),
    shell:
        PUBLIC_SHELL
