"""`streamback analyze <kind>`: one analysis of the trained runs, its tables (results/tables/) and
figures (results/figures/, SVG and PNG), paths from `streamback.layout`.

Kinds: `layer-error` (per-layer error and sign flips of every stream variant against the ground
truth), `envelope` (per-layer reach of the stream on the validation batch, and over training),
`swallowed` (updates each rounded add loses), `loss-difference` (baseline minus every other run of
its shape: curves, and the final paired difference with its confidence interval), `public` (the
first two on the Hugging Face models of `analysis.public_models`: `streamback.analysis.public`). The first three
also take model files outside the run matrix (`--model NAME=PATH`, e.g. from `streamback import-hf`).
Every run asked for (default: the whole matrix) is analysed or the command fails naming it.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import pandas as pd
import torch

from streamback import layout, sizes
from streamback.analysis.envelope import envelope, training_envelope
from streamback.analysis.figures import charts
from streamback.analysis.inputs import Subject, read_subject, subjects, validation_batch
from streamback.analysis.loss import (
    accumulation_rows,
    across_seeds_curves,
    final_differences,
    loss_curves,
    model_window_losses,
    primary_table,
    split_windows,
    thin,
)
from streamback.analysis.precision import layer_error, swallowed
from streamback.analysis.public import public_tables as tables
from streamback.charts import save_figure
from streamback.config import (
    DEFAULT_CONFIG,
    add_config_arguments,
    load_config,
    public_models,
    section_from_args,
    section_from_json,
)
from streamback.data.shards import TokenDataset
from streamback.errors import StreambackError
from streamback.io import write_csv
from streamback.progress import Progress
from streamback.runs import comparison_name, comparisons, run_matrix
from streamback.train.metrics import read_metrics

TRAINING_ENVELOPE_COLUMNS = ["run", "seed", "step", "tokens", "layer", "absmax", "max", "min"]
HELP = "analyse trained runs: layer-error, envelope, swallowed or loss-difference (tables and figures)"
KINDS = tuple(layout.ANALYSIS_TABLES)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("kind", choices=KINDS, help="which analysis")
    add_config_arguments(parser, "analysis")
    parser.add_argument(
        "--train-params",
        default=None,
        help="the 'train' section as a JSON object (what the rule passes; default: from --config)",
    )
    parser.add_argument(
        "--data",
        type=Path,
        default=None,
        help="token directory of the data stage (default: the config's, results/tokens/<corpus>)",
    )
    parser.add_argument(
        "--runs",
        nargs="+",
        default=None,
        help="runs to analyse (default: every run of train.runs; loss-difference: every compared run)",
    )
    parser.add_argument(
        "--model",
        action="append",
        default=[],
        metavar="NAME=PATH",
        help=(
            "also analyse this model file (layer-error, envelope, swallowed), e.g. one written by `streamback "
            "import-hf`"
        ),
    )
    parser.add_argument("--device", default=None, help="cuda or cpu (default: cuda when available)")
    parser.add_argument("--threads", type=int, default=None, help="CPU threads (default: torch's choice)")


def run(args: argparse.Namespace) -> int:
    """Write the tables and figures of `args.kind`, on the execution cli.main applied (threads, kernels, device)."""
    cfg = section_from_args(args, "analysis")
    config = load_config(args.config or DEFAULT_CONFIG) if args.train_params is None or args.data is None else None
    train_cfg = (
        section_from_json(args.train_params, "train", "--train-params")
        if args.train_params is not None
        else config["train"]
    )
    tokens = args.data or layout.tokens_dir(config["data"])
    if args.kind in ("loss-difference", "public") and args.model:
        raise StreambackError(
            f"{args.kind} takes no --model (loss-difference compares trained runs by their metrics; public "
            "reads the Hugging Face directories of analysis.public_models)"
        )
    runs = args.runs
    if runs is None and args.kind == "loss-difference":
        runs = list(dict.fromkeys(name for _, *pair in comparisons(run_matrix(train_cfg)) for name in pair))
    if args.kind == "public":
        if not public_models(cfg):
            raise StreambackError(
                "analyze public: analysis.public_models is empty (name it a model: NAME: <Hugging Face directory>)"
            )
        for name, directory in public_models(cfg).items():
            layout.checked_name(name, "analysis.public_models name")  # it names the model's figures
            if not (Path(directory) / "config.json").is_file():
                raise StreambackError(
                    f"analysis.public_models {name}: {directory} has no config.json (a local Hugging Face model "
                    f"directory)"
                )
        todo = list(public_models(cfg))
    else:
        todo = subjects(train_cfg, runs, args.model)
    device = args.execution_context.torch_device()
    began = time.perf_counter()
    tables_of = {
        "layer-error": layer_error_tables,
        "envelope": envelope_tables,
        "swallowed": swallowed_tables,
        "loss-difference": loss_tables,
        "public": public_tables,
    }[args.kind]
    tables = tables_of(todo, cfg, train_cfg, Path(tokens), device)
    for name, table in tables.items():
        write_csv(layout.table(name), table)
    computed = time.perf_counter() - began
    figures = write_figures(args.kind, tables, cfg["band"])
    print(
        f"analyze {args.kind}: {len(todo)} models on {device.type} in {computed:.1f} s, figures in "
        f"{time.perf_counter() - began - computed:.1f} s; wrote {', '.join(str(layout.table(n)) for n in tables)} "
        f"and {len(figures)} figures (.svg, .png) in {layout.FIGURES_DIR}"
    )
    return 0


def write_figures(kind: str, tables: dict[str, pd.DataFrame], band: float) -> list[str]:
    drawn = charts(kind, tables, band)
    for name, chart in drawn.items():
        save_figure(chart, name)
    return list(drawn)


def device_memory(device) -> int | None:
    """The bytes of a CUDA device's memory; None on the CPU (whose memory is the job's mem_mb)."""
    device = torch.device(device)
    return torch.cuda.get_device_properties(device).total_memory if device.type == "cuda" else None


def check_fits(kind: str, args, batch: int, seq_len: int, cfg: dict, capacity: int | None, where: str) -> None:
    """Before a model's analysis starts: its estimated peak (streamback/sizes.py) within the GPU's `capacity`, else
    one line naming the batch that fits (rather than an out-of-memory error after the models are read)."""
    if capacity is None:
        return
    problem = sizes.fit_problem(
        kind, sizes.shape_of_args(args), batch, seq_len, cfg["variants"], cfg["reference"], capacity, where
    )
    if problem is not None:
        raise StreambackError(problem)


def _per_model(
    todo: list[Subject], cfg: dict, train_cfg: dict, tokens: Path, name: str, steps_per_model: int, fn, device=None
) -> pd.DataFrame:
    """`fn(trained, batch, progress)` for each model on the validation batch, its rows tagged with the run and its
    training seed (first) and shape (last); on a GPU, each model checked to fit first (`check_fits`)."""
    batch = validation_batch(tokens, train_cfg["seq_len"], cfg["batch_size"])
    progress = Progress(f"analyze {name}", len(todo) * steps_per_model, "pass")
    capacity = device_memory(device) if device is not None else None
    frames = []
    for subject in todo:
        trained = read_subject(subject, tokens)
        check_fits(name, trained.args, cfg["batch_size"], train_cfg["seq_len"], cfg, capacity, subject.name)
        table = fn(trained, batch, progress)
        table.insert(0, "run", subject.name)
        table.insert(1, "seed", subject.seed)
        frames.append(table.assign(shape=subject.shape))
        progress.write(f"analyze {name}: {subject.name} done ({progress.line()})")
    progress.close()
    return pd.concat(frames, ignore_index=True)


def layer_error_tables(todo, cfg, train_cfg, tokens, device) -> dict[str, pd.DataFrame]:
    table = _per_model(
        todo,
        cfg,
        train_cfg,
        tokens,
        "layer-error",
        len(cfg["variants"]) + 1,
        lambda trained, batch, progress: layer_error(
            trained, batch, cfg["reference"], cfg["variants"], device, cfg["seed"], progress=progress
        ),
        device,
    )
    return {"layer_error": table.drop(columns="shape")}


def swallowed_tables(todo, cfg, train_cfg, tokens, device) -> dict[str, pd.DataFrame]:
    return {
        "swallowed": _per_model(
            todo,
            cfg,
            train_cfg,
            tokens,
            "swallowed",
            len(cfg["variants"]),
            lambda trained, batch, progress: swallowed(
                trained, batch, cfg["variants"], device, cfg["seed"], progress=progress
            ),
            device,
        )
    }


def public_tables(todo, cfg, train_cfg, tokens, device) -> dict[str, pd.DataFrame]:
    return tables(public_models(cfg), cfg, tokens, device)


def envelope_tables(todo, cfg, train_cfg, tokens, device) -> dict[str, pd.DataFrame]:
    def reach(trained, batch, progress):
        table = envelope(trained, batch, device).assign(stream=trained.stream)
        progress.update(1)
        return table

    frames = []
    for subject in todo:
        if subject.metrics is None:
            print(f"analyze envelope: {subject.name} has no training metrics (a model file): no envelope over training")
            continue
        logged = training_envelope(read_metrics(subject.metrics), subject.name)
        steps = logged.step.unique()
        logged = logged[logged.step.isin(steps[thin(len(steps), cfg["curve_points"])])]
        frames.append(logged.assign(run=subject.name, seed=subject.seed)[TRAINING_ENVELOPE_COLUMNS])
    on_batch = _per_model(todo, cfg, train_cfg, tokens, "envelope", 1, reach, device)
    return {
        "envelope": on_batch[["run", "seed", "layer", "max", "min", "abs_p999", "shape", "stream"]],
        "envelope_training": pd.concat(frames, ignore_index=True)
        if frames
        else pd.DataFrame(columns=TRAINING_ENVELOPE_COLUMNS),
    }


def loss_tables(todo, cfg, train_cfg, tokens, device) -> dict[str, pd.DataFrame]:
    names = {s.name: s for s in todo}
    matrix = run_matrix(train_cfg)
    pairs = [(shape, a, b) for shape, a, b in comparisons(matrix) if b in names]
    for shape, baseline, other in pairs:
        if baseline not in names:
            raise StreambackError(
                f"loss-difference: {other} is compared with {baseline}, but {baseline} is not among the runs asked for"
            )
    unpaired = set(names) - {r for _, a, b in pairs for r in (a, b)}
    if unpaired:
        raise StreambackError(
            f"loss-difference: nothing to compare {', '.join(sorted(unpaired))} with (a shape needs "
            "its baseline run and another run of the same seed)"
        )
    seq_len, count = train_cfg["seq_len"], cfg["loss_windows"] or train_cfg["log"]["val_sequences"]
    records = {name: read_metrics(s.metrics) for name, s in names.items()}
    progress = Progress("analyze loss-difference", 2 * len(names), "model")
    capacity = device_memory(device)
    losses = {}  # (run, split) -> per-window losses
    datasets = {split: TokenDataset(tokens, split) for split in ("train", "val")}
    windows = {split: split_windows(dataset, seq_len, count, split) for split, dataset in datasets.items()}
    for name, subject in names.items():
        trained = read_subject(subject, tokens)  # once for both splits
        check_fits("loss-difference", trained.args, cfg["micro_batch_size"], seq_len, cfg, capacity, name)
        for split, dataset in datasets.items():
            losses[name, split] = model_window_losses(
                trained, dataset, windows[split], seq_len, cfg["micro_batch_size"], device
            )
            progress.update(1, f"{name} {split}")
            progress.write(f"analyze loss-difference: {name} {split} done ({progress.line()})")
    progress.close()
    curves = []
    for shape, baseline, other in pairs:
        curve = loss_curves(records[baseline], records[other], cfg["smooth_steps"], cfg["curve_points"])
        curves.append(curve.assign(shape=shape, comparison=comparison_name(matrix[other]), seed=matrix[other].seed))
    curves = pd.concat(curves, ignore_index=True)
    finals = final_differences(pairs, matrix, losses, curves, cfg, count)
    curve_columns = [
        "shape",
        "comparison",
        "seed",
        "split",
        "step",
        "tokens",
        "difference",
        "smoothed",
        "band_low",
        "band_high",
    ]
    return {
        "loss_difference": finals,
        layout.PRIMARY_TABLE: primary_table(finals, cfg),
        "loss_curves": pd.concat([curves, across_seeds_curves(curves)], ignore_index=True)[curve_columns],
        "loss_accumulation": accumulation_rows(pairs, matrix, records, cfg["smooth_steps"], cfg["confidence"]),
    }
