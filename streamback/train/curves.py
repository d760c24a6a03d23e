"""`streamback training-curves`: the runs' training curves as a table and figures.

From each run's metrics.jsonl: loss, validation loss, gradient norm and learning rate against
tokens seen (`training_curves.csv`, with each run's training seed), and two figures, one panel per
shape and a line per run (every seed of an arm in the arm's colour and dashes):
training loss with the validation loss as points (`training_loss`), and the gradient norm
before clipping (`training_grad_norm`). The stream's envelope over training is the analyses'
(`envelope_training-<run>`).
"""

from __future__ import annotations

import argparse

import pandas as pd

from streamback import layout
from streamback.charts import save_figure
from streamback.config import add_config_arguments, section_from_args
from streamback.errors import StreambackError
from streamback.io import write_csv
from streamback.runs import run_matrix
from streamback.train.metrics import read_metrics

HELP = "the training curves of every run (loss, validation loss, gradient norm against tokens): a table and figures"
COLUMNS = ["run", "shape", "block", "stream", "seed", "step", "tokens", "loss", "val_loss", "grad_norm", "lr"]


def curves_table(train_cfg: dict, runs: list[str]) -> pd.DataFrame:
    """One row per step of each of `runs` (from its results/runs/<run>/metrics.jsonl)."""
    matrix = run_matrix(train_cfg)
    unknown = [r for r in runs if r not in matrix]
    if unknown:
        raise StreambackError(f"runs not in the train.runs matrix: {', '.join(unknown)} (runs: {', '.join(matrix)})")
    rows = []
    for run in runs:
        path = layout.metrics_file(run)
        if not path.exists():
            raise StreambackError(f"{path} does not exist: train the run first (rule train, {run})")
        spec = matrix[run]
        for r in read_metrics(path):
            rows.append(
                {
                    "run": run,
                    "shape": spec.shape,
                    "block": spec.block,
                    "stream": spec.stream,
                    "seed": spec.seed,
                    "step": r["step"],
                    "tokens": r["tokens"],
                    "loss": r["loss"],
                    "val_loss": r.get("val_loss"),
                    "grad_norm": r["grad_norm"],
                    "lr": r["lr"],
                }
            )
    return pd.DataFrame(rows, columns=COLUMNS)


CHART_ROWS = (
    4000  # rows a figure draws in all (the table keeps every step): Vega-Lite inlines each, Altair refuses past 5,000
)


def chart_rows(table: pd.DataFrame) -> pd.DataFrame:
    """The rows the figures draw: about CHART_ROWS / runs steps per run, evenly spaced, each run's
    last step and every step with a validation loss kept."""
    steps = table.groupby("run").step.transform("max")
    per_run = max(20, CHART_ROWS // max(1, table.run.nunique()) - 10)
    every = -(-steps // per_run)
    return table[(table.step % every == 0) | (table.step == steps) | table.val_loss.notna()]


def _panels(y: str, title: str, log: bool = False):
    import altair as alt

    scale = alt.Scale(type="log") if log else alt.Scale(zero=False)
    return (
        alt.Chart()
        .mark_line(strokeWidth=1.5)
        .encode(
            x=alt.X("tokens:Q", title="tokens seen"),
            y=alt.Y(f"{y}:Q", title=title, scale=scale),
            color=alt.Color("stream:N", title="stream"),
            strokeDash=alt.StrokeDash("block:N", title="block"),
            detail="run:N",
            tooltip=["run", "seed", "step", "tokens", alt.Tooltip(f"{y}:Q", format=".4f")],
        )
    )


def loss_chart(table: pd.DataFrame):
    """Training loss (lines) and validation loss (points) against tokens, a panel per shape, a line per run."""
    import altair as alt

    lines = _panels("loss", "loss (nats)")
    points = (
        alt.Chart()
        .mark_point(filled=True, size=40)
        .encode(
            x="tokens:Q",
            y="val_loss:Q",
            color="stream:N",
            shape=alt.Shape("block:N", legend=None),
            tooltip=["run", "step", alt.Tooltip("val_loss:Q", format=".4f")],
        )
        .transform_filter("isValid(datum.val_loss)")
    )
    return (
        alt.layer(lines, points, data=chart_rows(table))
        .properties(width=280, height=200)
        .facet(column=alt.Column("shape:N", title=None))
        .resolve_scale(y="independent")
        .properties(
            title=alt.TitleParams(
                "Training loss (lines) and validation loss (points) per run",
                subtitle=(
                    "A panel per shape, a colour per stream (the baseline's is bf16), dashes for the block; curves "
                    "that coincide are the finding: see the loss difference."
                ),
            )
        )
    )


def grad_norm_chart(table: pd.DataFrame):
    """Gradient norm before clipping against tokens (log scale), a panel per shape."""
    import altair as alt

    return (
        _panels("grad_norm", "gradient norm (before clipping)", log=True)
        .properties(data=chart_rows(table), width=280, height=200)
        .facet(column=alt.Column("shape:N", title=None))
        .resolve_scale(y="independent")
        .properties(
            title=alt.TitleParams(
                "Gradient norm per run",
                subtitle=(
                    "A slow monotone rise without a matching loss change is a sign of a stalled or biased stream (the "
                    "drift note)."
                ),
            )
        )
    )


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_config_arguments(parser, "train")
    parser.add_argument(
        "--runs", nargs="+", required=True, help="run names (each trained: results/runs/<run>/metrics.jsonl)"
    )


def run(args: argparse.Namespace) -> int:
    table = curves_table(section_from_args(args, "train"), args.runs)
    write_csv(layout.table(layout.TRAINING_TABLE), table)
    for name, chart in zip(layout.TRAINING_FIGURES, (loss_chart(table), grad_norm_chart(table))):
        save_figure(chart, name)
    print(
        f"training-curves: {len(args.runs)} runs, {len(table)} steps -> {layout.table(layout.TRAINING_TABLE)} and "
        f"{', '.join(layout.TRAINING_FIGURES)} (.{', .'.join(layout.FIGURE_SUFFIXES)})"
    )
    return 0
