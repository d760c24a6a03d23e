"""`streamback check`: the config files checked as the Snakefile checks them, before any job.

YAML errors with file and line, the schema, every run's model and recipe against the data, the
eval task names, each problem on its own line; a public model that no job could make (the export
of a run outside the matrix) is dropped with a warning, as the Snakefile drops it.
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
from streamback.runs import check_runs, run_matrix

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
    config = read_config_file(DEFAULT_CONFIG)
    for path in args.configfiles:
        config = merge_config(config, read_config_file(path))
    config = validate_config(config)
    check_runs(config["train"], config["model"], config["data"], tokenized=tokenized_train_split(config["data"]))
    check_task_names(config["eval"]["tasks"], config["eval"]["include_path"])
    runs = run_matrix(config["train"])
    for warning in drop_unexported_public_models(config["analysis"], runs):
        print(f"warning: {warning}", file=sys.stderr)
    print(
        f"config OK ({' + '.join(map(str, [DEFAULT_CONFIG.relative_to(ROOT), *args.configfiles]))}): {len(runs)} runs: "
        f"{', '.join(runs)}"
    )
    return 0


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
