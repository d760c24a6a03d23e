"""`streamback check`: the config files checked as the Snakefile checks them, before any job.

YAML errors with file and line, the schema, every run's model and recipe against the data, the
eval task names and eval.last_checkpoints, each problem on its own line; a public model that no
job could make (the export of a run outside the matrix) is dropped with a warning. `resolve` is
the one resolution of a config, which the Snakefile runs on the config Snakemake merged (its
--configfile files and --config values) and `streamback check` on the files it is given.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from streamback import layout
from streamback.config import DEFAULT_CONFIG, ROOT, merge_config, public_models, read_config_file, validate_config
from streamback.data.settings import tokenized_train_split
from streamback.eval.taskload import check_task_names
from streamback.runs import check_runs, run_matrix, snapshot_steps

HELP = (
    "check config files as the Snakefile does (YAML with file and line, the schema, every run's model and recipe, the "
    "eval task names)"
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "configfiles",
        nargs="*",
        type=Path,
        metavar="FILE",
        help=(
            f"files merged key by key over {DEFAULT_CONFIG.relative_to(ROOT)}, in order, as `snakemake --configfile "
            f"FILE ...`"
        ),
    )


def run(args: argparse.Namespace) -> int:
    config, warnings = resolve(read_files(args.configfiles))
    for warning in warnings:
        print(f"warning: {warning}", file=sys.stderr)
    runs = run_matrix(config["train"])
    print(
        f"config OK ({' + '.join(map(str, [DEFAULT_CONFIG.relative_to(ROOT), *args.configfiles]))}): {len(runs)} runs: "
        f"{', '.join(runs)}"
    )
    return 0


def read_files(files) -> dict:
    """The default config with `files` merged over it key by key, in order (as `snakemake --configfile`)."""
    config = read_config_file(DEFAULT_CONFIG)
    for path in files:
        config = merge_config(config, read_config_file(path))
    return config


def resolve(config: dict) -> tuple[dict, list[str]]:
    """The config as every job reads it, and the warnings to print: validated with defaults filled
    in, every run's model and recipe checked against the data, the eval task names and
    eval.last_checkpoints checked (a StreambackError names the first problem), then each public
    model no job could make dropped (`drop_unexported_public_models`)."""
    config = validate_config(config)
    check_runs(config["train"], config["model"], config["data"], tokenized=tokenized_train_split(config["data"]))
    check_task_names(config["eval"]["tasks"], config["eval"]["include_path"])
    snapshot_steps(config["train"], config["eval"])
    return config, drop_unexported_public_models(config["analysis"], run_matrix(config["train"]))


def drop_unexported_public_models(analysis: dict, runs) -> list[str]:
    """Set to null, as a config file would, each model of the validated `analysis.public_models` that is a run's
    export (results/hf/<run>, rule export_hf) of a run outside `runs` (the train.runs matrix) and is not there
    already: no job could make it. Returns a warning line for each. Relative paths are read from the working
    directory, as Snakemake reads them."""
    warnings, exports = [], layout.hf_dir("{run}").parent
    for name, directory in public_models(analysis).items():
        path = Path(os.path.normpath(directory))
        if path.parent == exports and path.name not in runs and not (path / "config.json").is_file():
            analysis["public_models"][name] = None
            warnings.append(
                f"analysis.public_models.{name} dropped: {directory} is the Hugging Face export of run "
                f"{path.name!r}, which is not in the train.runs matrix ({', '.join(runs) or 'no runs'}); "
                f"add the run to train.runs to analyse it, or set analysis.public_models.{name} to null"
            )
    return warnings
