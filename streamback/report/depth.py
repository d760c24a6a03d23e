"""`streamback depth`: does the fp32 stream matter more with depth? (rule depth)

From the tables the analyses already wrote, one row per depth and comparison (`streamback`, and
`streamback-<format>` where the tier trains streams below bf16) in results/tables/depth.csv:
- the final loss difference, baseline minus the compared run, over the training seeds, of the
  validation and the train split: loss_difference.csv's row over the seeds as it is (t interval,
  bootstrap over seeds then windows, MDE, Holm p over its family, equivalence verdict within the
  paper's band, the verdict's first words);
- per run, on its own weights (layer_error.csv, swallowed.csv): the sign flips of the parameter
  gradients and of the stream gradients with the compared stream (fp32 for StreamBack) over
  those with a bf16 stream, summed over the blocks; the largest activation error at the last layer
  boundary, the compared stream's over bf16's; the share of the sublayers' non-zero updates the
  bf16 stream and the compared stream round away (mean over the adds). A seed's two runs (both
  blocks) share their initial weights and batches, so each seed gives one value, the mean of its
  two runs, and each measure is the mean over the seeds with a t interval over the seeds;
- the stream's reach (envelope.csv: max |h| over the layer boundaries of the validation batch),
  of the baseline runs and of the compared runs, mean over seeds with its t interval.
Then results/tables/depth_trend.csv: each of these against log2(depth), the slope (change per
doubling of depth) with its t interval, p and bootstrap (`streamback.stats.depth_trend`, from the
same per-seed values), every adjacent contrast beside it (`<deeper>_vs_<shallower>`, the deeper
depth's mean minus the shallower's, with `_low`, `_high`: with three depths the slope weighs the
middle one 0), the slope's Holm-adjusted p over its family (`family`: the comparison's measures,
`p_holm`) and the verdict: "grows with depth" or "shrinks with depth" only where the slope's
intervals exclude 0, every contrast has its sign and the Holm p is at most 1 - confidence; "no
trend this tier resolves" otherwise. `depth_chart` draws every measure against depth with its
interval and the paper's claims: "roughly half" the sign flips (0.5) and a loss difference within
±analysis.band.
"""

from __future__ import annotations

import argparse
import json
import math

import altair as alt
import numpy as np
import pandas as pd

from streamback import layout, stats
from streamback.charts import save_figure
from streamback.config import DEFAULT_CONFIG, load_config, validate_config
from streamback.errors import StreambackError
from streamback.io import write_csv
from streamback.runs import comparison_name, comparisons, run_matrix

HELP = "does the fp32 stream matter more with depth? every measure per depth, and its trend (depth.csv)"
SOURCES = ("loss_difference", "layer_error", "swallowed", "envelope")  # the analyses' tables read
HALF = 0.5  # the paper: the fp32 stream has "roughly half" the bf16 stream's sign flips
# measure -> what it is, in words (the figure's panel titles and the trend table's `what`)
MEASURES = {
    "val_difference": "final validation loss, baseline minus compared (nats)",
    "train_difference": "final train loss, baseline minus compared (nats)",
    "grad_flip_ratio": "parameter-gradient sign flips, stream / bf16",
    "stream_grad_flip_ratio": "stream-gradient sign flips, stream / bf16",
    "last_error_ratio": "max activation error at the last layer, stream / bf16",
    "swallowed_bf16": "share of updates the bf16 stream swallows",
    "swallowed_stream": "share of updates the compared stream swallows",
    "stream_max_baseline": "the stream's max |h|, baseline runs",
    "stream_max_compared": "the stream's max |h|, compared runs",
}
LOSS_COLUMNS = ("ci_low", "ci_high", "boot_low", "boot_high", "mde", "seeds_for_band", "p_holm", "equivalence")
TREND_COLUMNS = [
    "comparison",
    "stream",
    "measure",
    "what",
    "depths",
    "slope",
    "low",
    "high",
    "df",
    "p",
    "boot_low",
    "boot_high",
    "family",
    "p_holm",
    "verdict",
]  # then each adjacent contrast before the verdict: <deeper>_vs_<shallower>, _low, _high


def _ratio(table: pd.DataFrame, value: str, stream: str) -> float:
    """sum of `value` with the stream `stream` over the sum with bf16, of one run's rows."""
    sums = table.groupby("variant")[value].sum()
    if stream not in sums.index or "bf16" not in sums.index or sums["bf16"] == 0:
        return math.nan
    return float(sums[stream] / sums["bf16"])


def run_measures(
    run: str, stream: str, layer_error: pd.DataFrame, swallowed: pd.DataFrame, envelope: pd.DataFrame
) -> dict:
    """One run's values of the per-run measures with stream `stream` against bf16 (NaN where an
    analysis did not measure that stream)."""
    errors = layer_error[layer_error.run == run]
    acts = errors[errors.kind == "activations"]
    last = acts[acts.layer == acts.layer.max()]
    swallow = swallowed[swallowed.run == run].groupby("variant").swallowed_fraction.mean()
    reach = envelope[envelope.run == run]
    return {
        "grad_flip_ratio": _ratio(errors[errors.kind == "gradients"], "sign_flips", stream),
        "stream_grad_flip_ratio": _ratio(errors[errors.kind == "stream_gradients"], "sign_flips", stream),
        "last_error_ratio": _ratio(last, "max_abs_error", stream),
        "swallowed_bf16": float(swallow.get("bf16", math.nan)),
        "swallowed_stream": float(swallow.get(stream, math.nan)),
        "stream_max": float(np.maximum(reach["max"].abs(), reach["min"].abs()).max()) if len(reach) else math.nan,
    }


RUN_MEASURES = ("grad_flip_ratio", "stream_grad_flip_ratio", "last_error_ratio", "swallowed_bf16", "swallowed_stream")


def units(config: dict, tables: dict[str, pd.DataFrame]) -> dict[tuple[str, str], dict[str, list[float]]]:
    """(shape, comparison) -> measure -> its independent values, one a training seed: the seed's
    final loss difference (paired: baseline minus compared), the mean over the seed's two runs of
    each per-run measure (both runs share the seed's initial weights and batches, so they are one
    unit, not two: `stats.per_seed`), and each arm's reach on the seed. The runs counted are under
    the key "runs" (an int)."""
    matrix = run_matrix(config["train"])
    loss = tables["loss_difference"]
    per_seed = loss[loss.seed.astype(str) != layout.ALL_SEEDS]
    out = {}
    for shape, baseline, other in comparisons(matrix):
        comparison, stream = comparison_name(matrix[other]), matrix[other].stream
        values = out.setdefault((shape, comparison), {**{m: [] for m in MEASURES}, "runs": 0})
        for split in ("val", "train"):
            rows = per_seed[
                (per_seed["shape"] == shape)
                & (per_seed.comparison == comparison)
                & (per_seed.split == split)
                & (per_seed.seed.astype(str) == str(matrix[other].seed))
            ]
            values[f"{split}_difference"] += rows.final_difference.tolist()
        measured = {
            run: run_measures(run, stream, tables["layer_error"], tables["swallowed"], tables["envelope"])
            for run in (baseline, other)
        }
        values["runs"] += 2  # a baseline run compared twice (two streams) counts once per comparison
        for key in RUN_MEASURES:  # the seed's two runs: one unit
            values[key] += stats.per_seed([measured[run][key] for run in (baseline, other)], [0, 0]).tolist()
        values["stream_max_baseline"].append(measured[baseline]["stream_max"])
        values["stream_max_compared"].append(measured[other]["stream_max"])
    return out


def _finite(values) -> np.ndarray:
    array = np.asarray(values, dtype=np.float64)
    return array[np.isfinite(array)]


def depth_tables(config: dict, tables: dict[str, pd.DataFrame]) -> tuple[pd.DataFrame, pd.DataFrame]:
    """depth.csv's rows (a depth and comparison each) and depth_trend.csv's (a comparison and measure
    each), from the analyses' `tables` (SOURCES) of the run matrix of `config`."""
    confidence = config["analysis"]["confidence"]
    shapes = config["model"]["shapes"]
    loss = tables["loss_difference"]
    over = loss[loss.seed.astype(str) == layout.ALL_SEEDS]
    matrix = run_matrix(config["train"])
    streams = {comparison_name(matrix[o]): matrix[o].stream for _, _, o in comparisons(matrix)}
    found = units(config, tables)
    rows = []
    for (shape, comparison), values in found.items():
        row = {
            "shape": shape,
            "depth": shapes[shape]["n_layers"],
            "dim": shapes[shape]["dim"],
            "comparison": comparison,
            "stream": streams[comparison],
            "seeds": len(values["val_difference"]),
            "runs": values["runs"],
        }
        for split in ("val", "train"):
            mine = over[(over["shape"] == shape) & (over.comparison == comparison) & (over.split == split)]
            if mine.empty:
                raise StreambackError(
                    f"{layout.table('loss_difference')} has no row over the seeds of {shape} {comparison} {split}: "
                    "run rule analyze_loss_difference again"
                )
            r = mine.iloc[0]
            row[f"{split}_difference"] = r.final_difference
            for column in LOSS_COLUMNS:
                row[f"{split}_{column.replace('ci_', '')}"] = r.get(column, math.nan)
            row[f"{split}_verdict"] = str(r.verdict).split(":")[0]
        for measure in list(MEASURES)[2:]:
            finite = _finite(values[measure])
            mean, low, high = stats.t_interval(finite, confidence) if finite.size else (math.nan,) * 3
            row.update({measure: mean, f"{measure}_low": low, f"{measure}_high": high})
        rows.append(row)
    table = pd.DataFrame(rows).sort_values(["comparison", "depth"], kind="stable", ignore_index=True)
    trends = []
    alpha = 1 - confidence
    for comparison, group in table.groupby("comparison", sort=False):
        keys = list(zip(group["shape"], group.comparison))
        mine = []
        for measure, what in MEASURES.items():
            samples = [_finite(found[key][measure]) for key in keys]
            kept = [(d, s) for d, s in zip(group.depth, samples) if s.size]
            trend = (
                stats.depth_trend([d for d, _ in kept], [s for _, s in kept], confidence)
                if kept
                else {"depths": 0, "p": math.nan, "contrasts": [], "verdict": stats.TREND_WORDS[2]}
            )
            mine.append((measure, what, trend))
        family = f"depth trends of {comparison}"
        for (measure, what, trend), adjusted in zip(mine, stats.holm([t.get("p", math.nan) for *_, t in mine])):
            steps = {}
            for c in trend.get("contrasts", []):
                name = f"{c['deeper']}_vs_{c['shallower']}"
                steps.update({name: c["estimate"], f"{name}_low": c["low"], f"{name}_high": c["high"]})
            verdict = stats.trend_verdict(trend, adjusted, alpha) if "slope" in trend else trend["verdict"]
            fields = {k: v for k, v in trend.items() if k not in ("contrasts", "verdict")}
            trends.append(
                {
                    "comparison": comparison,
                    "stream": streams[comparison],
                    "measure": measure,
                    "what": what,
                    **fields,
                    "family": family,
                    "p_holm": adjusted,
                    **steps,
                    "verdict": verdict,
                }
            )
    trend_table = pd.DataFrame(trends)
    contrasts = [c for c in trend_table.columns if "_vs_" in c]
    return table, trend_table.reindex(columns=TREND_COLUMNS[:-1] + contrasts + TREND_COLUMNS[-1:])


def _long(table: pd.DataFrame) -> pd.DataFrame:
    """depth.csv as one row per comparison, depth and measure: value, low, high."""
    frames = []
    for measure, what in MEASURES.items():
        low, high = (
            (f"{measure.split('_')[0]}_low", f"{measure.split('_')[0]}_high")
            if measure.endswith("difference")
            else (f"{measure}_low", f"{measure}_high")
        )
        frames.append(
            pd.DataFrame(
                {
                    "comparison": table.comparison,
                    "depth": table.depth,
                    "measure": what,
                    "value": table[measure],
                    "low": table[low],
                    "high": table[high],
                }
            )
        )
    return pd.concat(frames, ignore_index=True)


def depth_chart(table: pd.DataFrame, trend: pd.DataFrame, band: float) -> alt.ConcatChart:
    """Every measure against depth (log scale), a point per depth with its interval, a panel each,
    titled with its trend; the paper's claims marked: its band ±`band` on the loss differences, 0.5
    ("roughly half") on the sign-flip ratios."""
    data = _long(table)
    verdicts = {(r.comparison, r.what): r for r in trend.itertuples()}
    depths = sorted(table.depth.unique())
    panels = []
    for what in MEASURES.values():
        rows = data[data.measure == what]
        base = alt.Chart(rows).encode(
            x=alt.X(
                "depth:Q",
                scale=alt.Scale(type="log", domain=[depths[0] / 1.3, depths[-1] * 1.3], nice=False),
                axis=alt.Axis(values=depths, format="d"),
                title="layers",
            ),
            color=alt.Color("comparison:N", title="compared"),
        )
        layers = [
            base.mark_rule().encode(y=alt.Y("low:Q", title=None, scale=alt.Scale(zero=False)), y2="high:Q"),
            base.mark_line(point=True).encode(
                y="value:Q",
                tooltip=[
                    "comparison",
                    "depth",
                    alt.Tooltip("value:Q", format=".4g"),
                    alt.Tooltip("low:Q", format=".4g"),
                    alt.Tooltip("high:Q", format=".4g"),
                ],
            ),
        ]
        claims = [-band, band] if "loss" in what else [HALF] if "sign flips" in what else []
        if claims:
            layers.append(
                alt.Chart(pd.DataFrame({"claim": claims}))
                .mark_rule(strokeDash=[4, 3], color="gray")
                .encode(y="claim:Q")
            )
        main = verdicts.get(("streamback", what))
        subtitle = (
            f"slope {main.slope:+.3g} a doubling ({main.low:+.3g} to {main.high:+.3g}): {main.verdict}"
            if main is not None and pd.notna(main.slope)
            else ""
        )
        panels.append(
            alt.layer(*layers).properties(width=220, height=150, title=alt.Title(what, subtitle=subtitle, fontSize=11))
        )
    return alt.concat(*panels, columns=3).properties(
        title=alt.Title(
            "Does it matter more with depth?",
            subtitle=f"dashed: the paper's claims (loss within ±{band:g} nats; roughly half the sign flips)",
        )
    )


def read_sources() -> dict[str, pd.DataFrame]:
    """The analyses' tables depth.csv is built from; StreambackError naming the rule of one that is missing."""
    tables = {}
    for name in SOURCES:
        path = layout.table(name)
        if not path.exists():
            raise StreambackError(f"{path} does not exist: run rule analyze_{name} first")
        tables[name] = pd.read_csv(path)
    return tables


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", default=None, help=f"config file (default: {DEFAULT_CONFIG.name}); or:")
    parser.add_argument("--config-json", default=None, help="the merged config as JSON (what the rule passes)")


def run(args: argparse.Namespace) -> int:
    if args.config_json is not None:
        try:
            config = validate_config(json.loads(args.config_json))
        except json.JSONDecodeError as err:
            raise StreambackError(f"--config-json is not valid JSON: {err}") from None
    else:
        config = load_config(args.config or DEFAULT_CONFIG)
    table, trend = depth_tables(config, read_sources())
    write_csv(layout.table(layout.DEPTH_TABLES[0]), table)
    write_csv(layout.table(layout.DEPTH_TABLES[1]), trend)
    save_figure(depth_chart(table, trend, config["analysis"]["band"]), layout.DEPTH_FIGURE)
    shown = trend[trend.comparison == "streamback"]
    for r in shown.itertuples():
        print(f"depth: {r.measure}: slope {r.slope:+.4g} a doubling ({r.low:+.4g} to {r.high:+.4g}): {r.verdict}")
    print(
        f"depth: wrote {layout.table(layout.DEPTH_TABLES[0])}, {layout.table(layout.DEPTH_TABLES[1])} and "
        f"{layout.figure(layout.DEPTH_FIGURE, 'svg')} (.png)"
    )
    return 0
