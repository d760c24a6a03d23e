"""`streamback check`: the config files checked as the Snakefile checks them, before any job.

YAML errors with file and line, the schema, every run's model and recipe against the data, and
the eval task names, each problem on its own line.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from streamback.config import DEFAULT_CONFIG, ROOT, merge_config, read_config_file, validate_config
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
    print(
        f"config OK ({' + '.join(map(str, [DEFAULT_CONFIG.relative_to(ROOT), *args.configfiles]))}): {len(runs)} runs: "
        f"{', '.join(runs)}"
    )
    return 0
