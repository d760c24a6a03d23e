# streamback: residual-stream precision in Llama 3 training.
# Thin by design: config, validation, one rule file per stage, and the default target.
# The science lives in the `streamback` package; rules only call its CLI.

import sys
from pathlib import Path

from snakemake.utils import min_version

from streamback.check import resolve
from streamback.config import read_config_file
from streamback.errors import StreambackError
from streamback.runs import snapshot_steps

min_version("9.27")  # the rerun rules (workflow/rules/preflight.smk) are tested on 9.27

DEFAULT_CONFIG = Path(workflow.basedir) / "config" / "config.yaml"
try:
    read_config_file(DEFAULT_CONFIG)  # a YAML error with its file, line and column (Snakemake's own names neither)
except StreambackError as err:
    sys.exit(f"Error: {err}")

configfile: str(DEFAULT_CONFIG)


report: "workflow/report/workflow.rst"


# Before any job starts (and in a dry run): the one resolution of the config that `streamback
# check` also runs (streamback.check.resolve): the project's own validator (one line per bad key,
# defaults filled in), the cross-key check of every run and of eval.last_checkpoints, and the
# eval task names (lm-eval's TaskManager, offline; its own tasks' names cached); the message
# alone, no traceback. A public model that is the export of a run a narrowed train.runs left out
# is dropped, with a warning: no job could make it, and targets that never needed it still run.
try:
    resolved, warnings = resolve(config)
    config.update(resolved)
    SNAPSHOT_STEPS = snapshot_steps(config["train"], config["eval"])  # eval.last_checkpoints: the runs' earlier models
except StreambackError as err:
    merged = " merged with ".join(str(f) for f in [DEFAULT_CONFIG.relative_to(workflow.basedir), *workflow.overwrite_configfiles])
    sys.exit(f"Error in the config ({merged}): {err}")
for warning in warnings:
    print(f"warning: {warning}", file=sys.stderr)


include: "workflow/rules/common.smk"
include: "workflow/rules/fetch.smk"
include: "workflow/rules/drift.smk"
include: "workflow/rules/data.smk"
include: "workflow/rules/preflight.smk"
include: "workflow/rules/train.smk"
include: "workflow/rules/analysis.smk"
include: "workflow/rules/eval.smk"
include: "workflow/rules/report.smk"  # last: the study page takes every other stage's outputs
include: "workflow/rules/plan.smk"  # `snakemake plan`: every job's resources against its size


rule all:
    default_target: True
    input:
        final_outputs(),


# `snakemake fetch`, on the login node: what the config reads from the Hub, into hub_cache
# (workflow/rules/fetch.smk); nothing for a config whose data and tasks are local.
rule fetch:
    input:
        [str(layout.fetch_record(part)) for part in FETCH_PARTS],
