# streamback: residual-stream precision in Llama 3 training.
# Thin by design: config, validation, one rule file per stage, and the default target.
# The science lives in the `streamback` package; rules only call its CLI.

from pathlib import Path

from snakemake.utils import min_version, validate

min_version("9.0")

configfile: str(Path(workflow.basedir) / "config" / "config.yaml")


validate(config, "config/schema/config.schema.yaml")


include: "workflow/rules/common.smk"
include: "workflow/rules/drift.smk"
include: "workflow/rules/data.smk"
include: "workflow/rules/train.smk"
include: "workflow/rules/eval.smk"


rule all:
    default_target: True
    input:
        TARGETS,
