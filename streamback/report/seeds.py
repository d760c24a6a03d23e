"""`streamback seed-variance`: how much training's own randomness moves each score (rule seed_variance).

- results/tables/seed_variance.csv: per run arm (shape, block, stream: a run less its seed) and
  per quantity, its scores over the training seeds: `mean`, `sd` (ddof 1; empty for one seed),
  `min`, `max`, `seeds`. Quantities are the final losses (`task` loss, `metric` train or val: the
  final model's mean loss on the same windows of that split, as loss_difference.csv has them for
  every compared run) and every benchmark task, filter and metric (benchmarks.csv). The sd is the
  noise floor a difference between two arms must clear.
- results/figures/seed_differences.{svg,png}: every comparison's per-seed paired differences (the
  final losses from loss_difference.csv, the 0/1 benchmark metrics from benchmark_pairs.csv, in
  points) and, over the seeds, their mean with its t interval.
"""

from __future__ import annotations

import argparse

import pandas as pd

from streamback import layout, stats
from streamback.charts import save_figure
from streamback.config import add_config_arguments, section_from_args
from streamback.errors import StreambackError
from streamback.io import write_csv
from streamback.runs import run_matrix

HELP = "the seed-to-seed spread of every run arm's losses and benchmark scores (seed_variance.csv) and the per-seed differences' figure"
COLUMNS = ["arm", "shape", "block", "stream", "task", "filter", "metric", "mean", "sd", "min", "max", "seeds"]


def _read(name: str, rule: str) -> pd.DataFrame:
    path = layout.table(name)
    if not path.exists():
        raise StreambackError(f"{path} does not exist: run rule {rule} first")
    return pd.read_csv(path, keep_default_na=False, na_values=[""])


def seed_variance(train_cfg: dict, benchmarks: pd.DataFrame, loss_difference: pd.DataFrame) -> pd.DataFrame:
    """The rows of seed_variance.csv for the run matrix, from benchmarks.csv and loss_difference.csv."""
    matrix = run_matrix(train_cfg)
    by_seed = {(spec.arm, str(spec.seed)): name for name, spec in matrix.items()}
    scores = []
    for row in loss_difference[loss_difference.seed.astype(str) != layout.ALL_SEEDS].itertuples():
        for arm, value in ((f"{row.shape}-baseline", row.baseline_loss), (f"{row.shape}-{row.comparison}", row.compared_loss)):
            run = by_seed.get((arm, str(row.seed)))
            if run is not None:
                scores.append({"run": run, "task": "loss", "filter": "none", "metric": row.split, "value": value})
    missing = sorted(set(matrix) - set(benchmarks.run))
    if missing:
        raise StreambackError(f"{layout.table('benchmarks')} has no rows of {', '.join(missing)}: run rule benchmark_table again")
    losses = pd.DataFrame(scores, columns=["run", "task", "filter", "metric", "value"]).drop_duplicates()
    frame = pd.concat([losses, benchmarks[benchmarks.run.isin(list(matrix))][["run", "task", "filter", "metric", "value"]]],
                      ignore_index=True)
    frame = frame.assign(arm=frame.run.map(lambda r: matrix[r].arm)).dropna(subset=["value"])
    rows = []
    for (arm, task, filt, metric), group in frame.groupby(["arm", "task", "filter", "metric"], sort=False):
        spec = next(s for s in matrix.values() if s.arm == arm)
        summary = stats.across_seeds(group.value.to_numpy(dtype=float), 0.95)
        rows.append({"arm": arm, "shape": spec.shape, "block": spec.block, "stream": spec.stream, "task": task, "filter": filt,
                     "metric": metric, "mean": summary["mean"], "sd": summary["sd"], "min": summary["min"], "max": summary["max"],
                     "seeds": summary["n"]})
    return pd.DataFrame(rows, columns=COLUMNS)


def differences(loss_difference: pd.DataFrame, pairs: pd.DataFrame) -> pd.DataFrame:
    """Long table of every comparison's differences: per seed (`level` seed) and over seeds (`all`),
    losses in nats (baseline minus the other run), benchmarks in points (the other run minus the baseline)."""
    loss = loss_difference.assign(kind="loss (nats)", quantity="final " + loss_difference.split + " loss",
                                  difference=loss_difference.final_difference, low=loss_difference.ci_low, high=loss_difference.ci_high)
    bench = pairs.assign(kind="benchmarks (points)",
                         quantity=pairs.task + " " + pairs.metric + pairs["filter"].map(lambda f: "" if f == "none" else f" ({f})"),
                         difference=100 * pairs["diff"], low=100 * pairs.ci_low, high=100 * pairs.ci_high)
    both = pd.concat([loss, bench], ignore_index=True)
    both["level"] = both.seed.astype(str).map(lambda s: "over seeds" if s == layout.ALL_SEEDS else "one seed")
    return both[["shape", "comparison", "kind", "quantity", "seed", "level", "difference", "low", "high"]]


def differences_chart(data: pd.DataFrame):
    """A row per shape, a column per kind (loss, benchmarks): each seed's difference (small points)
    and their mean over seeds with its t interval (bar and large point), a colour per comparison."""
    import altair as alt

    seeds = data[data.level == "one seed"].seed.nunique()
    base = alt.Chart().encode(y=alt.Y("quantity:N", title=None), yOffset="comparison:N",
                              color=alt.Color("comparison:N", title="comparison", scale=alt.Scale(scheme="dark2")))
    each = base.transform_filter("datum.level == 'one seed'").mark_point(size=25, opacity=0.7).encode(
        x=alt.X("difference:Q", title="difference"), tooltip=["comparison", "quantity", "seed", alt.Tooltip("difference:Q", format=".4f")])
    over = base.transform_filter("datum.level == 'over seeds'")
    bars = over.mark_rule(strokeWidth=2).encode(x="low:Q", x2="high:Q")
    mean = over.mark_point(filled=True, size=60, shape="diamond").encode(
        x="difference:Q", tooltip=["comparison", "quantity", alt.Tooltip("difference:Q", format=".4f"),
                                   alt.Tooltip("low:Q", format=".4f"), alt.Tooltip("high:Q", format=".4f")])
    zero = alt.Chart().mark_rule(color="gray", strokeWidth=0.5).encode(x=alt.datum(0))
    return alt.layer(zero, each, bars, mean, data=data).properties(width=300).facet(
        row=alt.Row("shape:N", title=None), column=alt.Column("kind:N", title=None)).resolve_scale(
        x="independent", y="independent").properties(title=alt.TitleParams(
            f"Each comparison's difference per training seed ({seeds} seed{'s' if seeds != 1 else ''}) and over the seeds",
            subtitle=["points: one seed each; diamond and bar: their mean with its t interval over seeds (none for one seed)",
                      "positive: the other run is better (losses: baseline minus it; benchmarks: it minus the baseline)"]))


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_config_arguments(parser, "train")


def run(args: argparse.Namespace) -> int:
    train_cfg = section_from_args(args, "train")
    loss, pairs = _read("loss_difference", "analyze_loss_difference"), _read("benchmark_pairs", "benchmark_table")
    table = seed_variance(train_cfg, _read("benchmarks", "benchmark_table"), loss)
    write_csv(layout.table(layout.SEED_TABLE), table)
    save_figure(differences_chart(differences(loss, pairs)), layout.SEED_FIGURE)
    seeds = int(table.seeds.max()) if len(table) else 0
    print(f"seed-variance: {table.arm.nunique()} arms over up to {seeds} seed(s) -> {layout.table(layout.SEED_TABLE)} and "
          f"{layout.SEED_FIGURE} (.{', .'.join(layout.FIGURE_SUFFIXES)})")
    return 0
