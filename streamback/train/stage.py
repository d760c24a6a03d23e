"""`streamback train`: the command line of one run's training (`streamback.train.trainer.train`).

The rule passes the run's sections as JSON (`--params`, `--model-params`, `--execution`) and its
threads; by hand, `--config FILE` gives the same from a config file. Threads and kernels are the
execution cli.main decided from the job's config (`default_threads`: the run's
train.resources.threads where `--threads` is not given and no `--params`). Exit statuses: the
trainer module's docstring.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from streamback import layout
from streamback.config import DEFAULT_CONFIG, add_config_arguments, load_config, section_from_args, section_from_json
from streamback.runs import run_setting
from streamback.train.trainer import train

HELP = "train one run of the matrix (resumes from its newest checkpoint; torchrun for several processes)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_config_arguments(parser, "train")
    parser.add_argument(
        "--model-params",
        default=None,
        help="the 'model' section as a JSON object (what the rule passes; default: from --config)",
    )
    # not --run: torchrun parses the whole command line and takes --run for an abbreviation of its --run-path
    parser.add_argument(
        "--run-name", required=True, help="run name, e.g. fat-short-streamback (see `train.runs` in the config)"
    )
    parser.add_argument(
        "--data",
        type=Path,
        default=None,
        help="token directory of the data stage (default: the config's, results/tokens/<corpus>)",
    )
    parser.add_argument(
        "--outdir",
        type=Path,
        default=None,
        help="for model.pt, metrics.jsonl and summary.json (default: results/runs/<run>)",
    )
    parser.add_argument(
        "--checkpoints",
        type=Path,
        default=None,
        help="the run's checkpoint directory: a recipe-*/ per recipe (checkpoints, live metrics.jsonl), trainer.lock, "
        "verified-shards.json (default: results/checkpoints/<run>)",
    )
    parser.add_argument(
        "--tensorboard",
        type=Path,
        default=None,
        help="the run's TensorBoard directory, an event directory per recipe in it "
        "(default: results/tensorboard/<run>; train.log.tensorboard: false writes none)",
    )
    parser.add_argument(
        "--threads",
        type=int,
        default=None,
        help=(
            "CPU threads per process (default: with --params, torch's choice; else the run's train.resources.threads, "
            "as the rule passes)"
        ),
    )
    parser.add_argument(
        "--snapshot-steps",
        type=int,
        nargs="*",
        default=[],
        metavar="STEP",
        help="also write the model at these earlier steps, as <outdir>/last/step_<N>.pt (eval.last_checkpoints)",
    )
    parser.add_argument(
        "--status-file",
        type=Path,
        default=None,
        help="also write the exit status to this file (rank 0), for launchers such as torchrun that report their own",
    )


def default_threads(args: argparse.Namespace) -> int | None:
    """The threads of a run trained without `--threads`: with `--params` torch's choice (None),
    else the run's train.resources.threads of the config, as the rule passes them."""
    if args.params is not None:
        return None
    return run_setting(section_from_args(args, "train"), args.run_name, "resources")["threads"]


def run(args: argparse.Namespace) -> int:
    """Train as the arguments say, on the execution cli.main applied (threads, kernels); cli.main
    writes `--status-file`."""
    train_cfg = section_from_args(args, "train")
    # the model and data sections come from the config file unless given (as the rule does)
    config = load_config(args.config or DEFAULT_CONFIG) if args.model_params is None or args.data is None else None
    if args.model_params is not None:
        model_cfg = section_from_json(args.model_params, "model", "--model-params")
    else:
        model_cfg = config["model"]
    return train(
        train_cfg,
        model_cfg,
        args.run_name,
        args.data or layout.tokens_dir(config["data"]),
        args.outdir or layout.run_dir(args.run_name),
        args.checkpoints or layout.checkpoint_dir(args.run_name),
        tensorboard=args.tensorboard or layout.tensorboard_dir(args.run_name),
        snapshot_steps=args.snapshot_steps,
    )
