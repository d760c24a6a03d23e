"""`streamback seed-variance`: how much training's own randomness moves each score (rule seed_variance).

- results/tables/seed_variance.csv: per run arm (shape, block, stream: a run less its seed) and
  per quantity, its scores over the training seeds: `mean`, `sd` (ddof 1; empty for one seed),
  `min`, `max`, `seeds`. Quantities are the final losses (`task` loss, `metric` train or val: the
  final model's mean loss on the same windows of that split, as loss_difference.csv has them for
  every compared run) and every benchmark task, filter and metric (benchmarks.csv). The sd is the
  noise floor a difference between two arms must clear.
- results/tables/task_snr.csv: per benchmark task, filter and metric, signal-and-noise's
  signal-to-noise ratio (`streamback.stats.task_snr`), best first: with `--checkpoints`
  (benchmark_checkpoints.csv, eval.last_checkpoints k > 1) as the reference has it, each run a
  model and its last k checkpoints its repeated scores; else over the run arms with two seeds
  or more, their seeds the repeated scores (`noise_from` says which), with the decision accuracy
  it implies and `can_rank`, false where the task cannot rank these models.
- results/figures/seed_differences.{svg,png}: the forest plot of every comparison: its per-seed
  paired differences (the final losses from loss_difference.csv, the 0/1 benchmark metrics from
  benchmark_pairs.csv, in points) and, over the seeds, their mean with its t interval, the
  bootstrap over seeds then items, the minimum detectable effect and the paper's band.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import pandas as pd

from streamback import layout, stats
from streamback.charts import save_figure
from streamback.config import add_config_arguments, section_from_args
from streamback.errors import StreambackError
from streamback.io import write_csv
from streamback.runs import run_matrix

HELP = (
    "the seed-to-seed spread of every run arm's losses and benchmark scores (seed_variance.csv) and the per-seed "
    "differences' figure"
)
COLUMNS = ["arm", "shape", "block", "stream", "task", "filter", "metric", "mean", "sd", "min", "max", "seeds"]
SNR_COLUMNS = [
    "task",
    "filter",
    "metric",
    "noise_from",
    "models",
    "signal",
    "noise",
    "snr",
    "decision_accuracy",
    "can_rank",
]


def _read(name: str | Path, rule: str) -> pd.DataFrame:
    """A table by its name (results/tables/<name>.csv) or path."""
    path = name if isinstance(name, Path) else layout.table(name)
    if not path.exists():
        raise StreambackError(f"{path} does not exist: run rule {rule} first")
    return pd.read_csv(path, keep_default_na=False, na_values=[""])


def seed_variance(train_cfg: dict, benchmarks: pd.DataFrame, loss_difference: pd.DataFrame) -> pd.DataFrame:
    """The rows of seed_variance.csv for the run matrix, from benchmarks.csv and loss_difference.csv."""
    matrix = run_matrix(train_cfg)
    by_seed = {(spec.arm, str(spec.seed)): name for name, spec in matrix.items()}
    scores = []
    for row in loss_difference[loss_difference.seed.astype(str) != layout.ALL_SEEDS].itertuples():
        for arm, value in (
            (f"{row.shape}-baseline", row.baseline_loss),
            (f"{row.shape}-{row.comparison}", row.compared_loss),
        ):
            run = by_seed.get((arm, str(row.seed)))
            if run is not None:
                scores.append({"run": run, "task": "loss", "filter": "none", "metric": row.split, "value": value})
    missing = sorted(set(matrix) - set(benchmarks.run))
    if missing:
        raise StreambackError(
            f"{layout.table('benchmarks')} has no rows of {', '.join(missing)}: run rule benchmark_table again"
        )
    losses = pd.DataFrame(scores, columns=["run", "task", "filter", "metric", "value"]).drop_duplicates()
    frame = pd.concat(
        [losses, benchmarks[benchmarks.run.isin(list(matrix))][["run", "task", "filter", "metric", "value"]]],
        ignore_index=True,
    )
    frame = frame.assign(arm=frame.run.map(lambda r: matrix[r].arm)).dropna(subset=["value"])
    rows = []
    for (arm, task, filt, metric), group in frame.groupby(["arm", "task", "filter", "metric"], sort=False):
        spec = next(s for s in matrix.values() if s.arm == arm)
        summary = stats.across_seeds(group.value.to_numpy(dtype=float), 0.95)
        rows.append(
            {
                "arm": arm,
                "shape": spec.shape,
                "block": spec.block,
                "stream": spec.stream,
                "task": task,
                "filter": filt,
                "metric": metric,
                "mean": summary["mean"],
                "sd": summary["sd"],
                "min": summary["min"],
                "max": summary["max"],
                "seeds": summary["n"],
            }
        )
    return pd.DataFrame(rows, columns=COLUMNS)


def task_snr(train_cfg: dict, benchmarks: pd.DataFrame, checkpoints: pd.DataFrame | None = None) -> pd.DataFrame:
    """The rows of task_snr.csv: per task, filter and metric with a value, `stats.task_snr`; best
    SNR first. With `checkpoints` (benchmark_checkpoints.csv) the models are the runs, each with
    its last checkpoints' scores; else the run arms that have two seeds or more, each with its
    scores over its seeds."""
    matrix = run_matrix(train_cfg)
    if checkpoints is not None:
        scored, model = checkpoints[checkpoints.run.isin(list(matrix))].dropna(subset=["value"]), "run"
        steps = scored.groupby("run").step.nunique()
        source = f"last {steps.min()} checkpoints" if len(steps) and steps.min() == steps.max() else "last checkpoints"
    else:
        scored, model, source = (
            benchmarks[benchmarks.run.isin(list(matrix))].dropna(subset=["value"]),
            "arm",
            "training seeds",
        )
        scored = scored.assign(arm=scored.run.map(lambda r: matrix[r].arm))
    rows = []
    for (task, filt, metric), group in scored.groupby(["task", "filter", "metric"], sort=False):
        models = {name: g.value.to_numpy(dtype=float) for name, g in group.groupby(model, sort=False) if len(g) > 1}
        rows.append({"task": task, "filter": filt, "metric": metric, "noise_from": source, **stats.task_snr(models)})
    return pd.DataFrame(rows, columns=SNR_COLUMNS).sort_values(
        "snr", ascending=False, na_position="last", kind="stable"
    )


def differences(loss_difference: pd.DataFrame, pairs: pd.DataFrame) -> pd.DataFrame:
    """Long table of every comparison's differences: per seed (`level` one seed) and over seeds
    (`over seeds`: with the t interval `low`/`high`, the bootstrap over seeds then items
    `boot_low`/`boot_high`, the minimum detectable effect `mde` and, for losses, the paper's
    `band`), losses in nats (baseline minus the other run), benchmarks in points (the other run
    minus the baseline)."""

    def column(frame, name):
        return frame[name] if name in frame.columns else pd.Series(float("nan"), index=frame.index)

    loss = loss_difference.assign(
        kind="loss (nats)",
        quantity="final " + loss_difference.split + " loss",
        difference=loss_difference.final_difference,
        low=loss_difference.ci_low,
        high=loss_difference.ci_high,
        boot_low=column(loss_difference, "boot_low"),
        boot_high=column(loss_difference, "boot_high"),
        mde=column(loss_difference, "mde"),
        band=column(loss_difference, "band"),
    )
    bench = pairs.assign(
        kind="benchmarks (points)",
        quantity=pairs.task + " " + pairs.metric + pairs["filter"].map(lambda f: "" if f == "none" else f" ({f})"),
        difference=100 * pairs["diff"],
        low=100 * pairs.ci_low,
        high=100 * pairs.ci_high,
        boot_low=100 * column(pairs, "boot_low"),
        boot_high=100 * column(pairs, "boot_high"),
        mde=100 * column(pairs, "mde"),
        band=float("nan"),
    )
    both = pd.concat([loss, bench], ignore_index=True)
    both["level"] = both.seed.astype(str).map(lambda s: "over seeds" if s == layout.ALL_SEEDS else "one seed")
    over = both.level == "over seeds"
    both.loc[~over, ["boot_low", "boot_high", "mde", "band"]] = float("nan")
    both["verdict"] = [str(v).split(":")[0] if o else "" for v, o in zip(column(both, "verdict"), over)]
    return both[
        [
            "shape",
            "comparison",
            "kind",
            "quantity",
            "seed",
            "level",
            "difference",
            "low",
            "high",
            "boot_low",
            "boot_high",
            "mde",
            "band",
            "verdict",
        ]
    ]


def differences_chart(data: pd.DataFrame, order: list[str] | None = None):
    """The forest plot of every comparison: a row per shape (in `order`, the config's
    train.runs.shapes: the paper's skinny-tall, medium, fat-short; default the table's), a column
    per kind (loss, benchmarks), drawn to fit a 1,400-pixel page;
    per comparison and quantity, each seed's difference (small points), their mean over seeds
    (diamond) with its t interval (thick bar) and the bootstrap over seeds then items (thin bar
    under it), the band of the minimum detectable effect around 0 (grey) and, on the losses, the
    paper's band (blue); a colour per comparison."""
    import altair as alt

    seeds = data[data.level == "one seed"].seed.nunique()
    data = data.assign(mde_low=-data.mde, mde_high=data.mde, band_low=-data.band, band_high=data.band)
    base = alt.Chart().encode(
        y=alt.Y("quantity:N", title=None),
        yOffset="comparison:N",
        color=alt.Color("comparison:N", title="comparison", scale=alt.Scale(scheme="dark2")),
    )
    over = base.transform_filter("datum.level == 'over seeds'")
    paper = (
        alt.Chart()
        .transform_filter("datum.level == 'over seeds' && isValid(datum.band)")
        .transform_aggregate(band_low="min(band_low)", band_high="max(band_high)", groupby=["shape", "kind"])
        .mark_rect(color="#9ecae1", opacity=0.35)
        .encode(
            x="band_low:Q",
            x2="band_high:Q",
            tooltip=[alt.Tooltip("band_high:Q", title="the paper's band ±", format=".4f")],
        )
    )
    mde = (
        over.transform_filter("isValid(datum.mde)")
        .mark_rect(color="gray", opacity=0.18)
        .encode(
            x="mde_low:Q",
            x2="mde_high:Q",
            color=alt.value("gray"),
            tooltip=["comparison", "quantity", alt.Tooltip("mde:Q", format=".4f", title="MDE ±")],
        )
    )
    each = (
        base.transform_filter("datum.level == 'one seed'")
        .mark_point(size=25, opacity=0.7)
        .encode(
            x=alt.X("difference:Q", title="difference"),
            tooltip=["comparison", "quantity", "seed", alt.Tooltip("difference:Q", format=".4f")],
        )
    )
    t_bar = over.mark_rule(strokeWidth=4, opacity=0.55).encode(x="low:Q", x2="high:Q")
    boot_bar = (
        over.transform_filter("isValid(datum.boot_low)")
        .mark_rule(strokeWidth=1.2, color="black")
        .encode(x="boot_low:Q", x2="boot_high:Q", color=alt.value("black"))
    )
    mean = over.mark_point(filled=True, size=60, shape="diamond").encode(
        x="difference:Q",
        tooltip=[
            "comparison",
            "quantity",
            "verdict",
            alt.Tooltip("difference:Q", format=".4f"),
            alt.Tooltip("low:Q", format=".4f", title="t low"),
            alt.Tooltip("high:Q", format=".4f", title="t high"),
            alt.Tooltip("boot_low:Q", format=".4f", title="bootstrap low"),
            alt.Tooltip("boot_high:Q", format=".4f", title="bootstrap high"),
            alt.Tooltip("mde:Q", format=".4f"),
        ],
    )
    zero = alt.Chart().mark_rule(color="gray", strokeWidth=0.5).encode(x=alt.datum(0))
    return (
        alt.layer(paper, mde, zero, each, t_bar, boot_bar, mean, data=data)
        .properties(width=300)
        .facet(
            row=alt.Row("shape:N", title=None, sort=list(order or dict.fromkeys(data["shape"]))),
            column=alt.Column("kind:N", title=None),
        )
        .resolve_scale(x="independent", y="independent")
        .properties(
            title=alt.TitleParams(
                f"Each comparison's difference per training seed ({seeds} seed{'s' if seeds != 1 else ''}) and over "
                f"the seeds",
                subtitle=[
                    (
                        "points: one seed each; diamond: their mean; thick bar: its t interval over seeds; thin black "
                        "bar: the bootstrap "
                        "over seeds then items"
                    ),
                    (
                        "grey: ± the minimum detectable effect over the seeds; blue: the paper's band (losses); "
                        "positive: the other run is better"
                    ),
                ],
            )
        )
    )


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_config_arguments(parser, "train")
    parser.add_argument(
        "--checkpoints",
        type=Path,
        default=None,
        metavar="CSV",
        help="benchmark_checkpoints.csv (eval.last_checkpoints > 1): task_snr.csv's noise from "
        "the runs' last checkpoints, not from the seeds",
    )


def run(args: argparse.Namespace) -> int:
    train_cfg = section_from_args(args, "train")
    loss, pairs = _read("loss_difference", "analyze_loss_difference"), _read("benchmark_pairs", "benchmark_table")
    benchmarks = _read("benchmarks", "benchmark_table")
    table = seed_variance(train_cfg, benchmarks, loss)
    write_csv(layout.table(layout.SEED_TABLE), table)
    checkpoints = _read(args.checkpoints, "benchmark_table") if args.checkpoints is not None else None
    write_csv(layout.table(layout.TASK_SNR_TABLE), task_snr(train_cfg, benchmarks, checkpoints))
    save_figure(differences_chart(differences(loss, pairs), train_cfg["runs"]["shapes"]), layout.SEED_FIGURE)
    seeds = int(table.seeds.max()) if len(table) else 0
    print(
        f"seed-variance: {table.arm.nunique()} arms over up to {seeds} seed(s) -> {layout.table(layout.SEED_TABLE)}, "
        f"{layout.table(layout.TASK_SNR_TABLE)} and "
        f"{layout.SEED_FIGURE} (.{', .'.join(layout.FIGURE_SUFFIXES)})"
    )
    return 0
