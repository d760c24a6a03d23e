"""The study's answer in a few sentences, written from its tables every time (never hard-coded).

Each sentence reads one stage's CSV under results/tables/: the final loss differences with their
paired confidence intervals (`loss_difference`), the benchmark comparisons after Holm's correction
(`benchmark_pairs`), the layer error at the last layer boundary (`layer_error`), the share of updates
a stream rounds away (`swallowed`) and the reach of the stream (`envelope`). A table that is not there
gives a sentence saying so.
"""

from __future__ import annotations

import pandas as pd

from streamback import layout
from streamback.html_report import Missing


def _table(name: str) -> pd.DataFrame | None:
    path = layout.table(name)
    return pd.read_csv(path) if path.exists() else None


def compared(config: dict) -> str:
    """What was compared, in one sentence, from the run matrix."""
    runs = config["train"]["runs"]
    shapes = ", ".join(runs["shapes"])
    text = (f"Compared: the baseline block (its residual stream in bf16) and the StreamBack block (stream in fp32, sublayers "
            f"still in bf16) on {len(runs['shapes'])} shapes ({shapes}), each trained on {config['train']['tokens']:,} tokens")
    if runs["streams"]:
        where = ", ".join(runs["stream_shapes"] or runs["shapes"])
        text += f"; and StreamBack with its stream kept below bf16 ({', '.join(runs['streams'])}) on {where}"
    return text + ". Differences are baseline minus the other run: positive means the other run is better, as in the seed."


def _verdict(lo: float, hi: float) -> str:
    return "distinguishable from zero" if lo > 0 or hi < 0 else "not distinguishable from zero"


def loss(config: dict) -> list[str]:
    table = _table("loss_difference")
    if table is None:
        return [Missing("The loss differences are not available: the loss-difference analysis has not run.")]
    val = table[table.split == "val"]
    confidence, band = config["analysis"]["confidence"], config["analysis"]["band"]
    out = []
    for row in val[val.comparison == "streamback"].itertuples():
        d = row.final_difference
        out.append(f"On {row.shape}, StreamBack's final validation loss is {abs(d):.4f} nats {'lower' if d > 0 else 'higher'} than the "
                   f"baseline's ({confidence:.0%} CI of the difference {row.ci_low:+.4f} to {row.ci_high:+.4f}, paired over the same "
                   f"validation windows): {_verdict(row.ci_low, row.ci_high)}, {'inside' if abs(d) <= band else 'outside'} the seed's "
                   f"band of ±{band:g}.")
    if len(out):
        out.append(f"These intervals cover the validation windows only: each run was trained once, from seed {config['train']['seed']}, "
                   "so a difference near the band may also be the two training runs' own randomness, which no interval here includes.")
    below = val[val.comparison != "streamback"]
    if len(below):
        parts = [f"{r.comparison.removeprefix('streamback-')} {r.final_difference:+.4f} ({r.ci_low:+.4f} to {r.ci_high:+.4f}"
                 f"{'' if r.ci_low > 0 or r.ci_high < 0 else ', within noise'})" for r in below.itertuples()]
        out.append(f"Below bf16 (on {', '.join(dict.fromkeys(below['shape']))}), the baseline's final validation loss minus each "
                   f"stream's, in nats, with its {confidence:.0%} CI: " + "; ".join(parts) + ".")
    return out


def benchmarks(config: dict) -> list[str]:
    pairs = _table("benchmark_pairs")
    if pairs is None:
        return [Missing("The benchmark comparison is not available: the evaluation has not run.")]
    alpha = config["eval"]["pairs"]["alpha"]
    real = pairs[pairs.p_holm <= alpha]
    head = (f"Of {len(pairs)} benchmark comparisons of a run against its shape's baseline on the same items "
            f"({pairs.task.nunique()} tasks), {len(real)} {'is' if len(real) == 1 else 'are'} distinguishable from noise "
            f"after Holm's correction over each run's tasks (alpha {alpha:g})")
    if real.empty:
        smallest = pairs.mdd.dropna()
        detectable = f"; with these item counts only differences of about {100 * smallest.min():.0f} to {100 * smallest.max():.0f} points would be found 80% of the time" if len(smallest) else ""
        return [head + detectable + "."]
    listed = "; ".join(f"{r.run} on {r.task} ({100 * r['diff']:+.1f} points, p = {r.p_holm:.2g})" for _, r in real.iterrows())
    return [f"{head}: {listed}."]


def layer_error() -> list[str]:
    table = _table("layer_error")
    if table is None:
        return [Missing("The per-layer error is not available: the layer-error analysis has not run.")]
    acts = table[table.kind == "activations"]
    last = acts[acts.layer == acts.groupby("run").layer.transform("max")].pivot_table(index="run", columns="variant", values="max_abs_error")
    if not {"bf16", "fp32"} <= set(last.columns):
        return []
    ratio = (last["bf16"] / last["fp32"]).replace([float("inf")], float("nan")).dropna()
    flips = table[(table.kind == "activations")].groupby("variant").sign_flip_fraction.median()
    return [f"Against a full-precision forward pass of the same weights, the fp32 stream's largest error at the last layer boundary is "
            f"{ratio.median():.1f} times smaller than the bf16 stream's (median over {len(ratio)} runs; range {ratio.min():.1f} to "
            f"{ratio.max():.1f}), and {100 * flips.get('fp32', float('nan')):.2f}% of the stream's coordinates flip sign against "
            f"{100 * flips.get('bf16', float('nan')):.2f}% with bf16 (medians over layers and runs)."]


def swallowed() -> list[str]:
    table = _table("swallowed")
    if table is None:
        return [Missing("The swallowed updates are not available: the swallowed analysis has not run.")]
    share = table.groupby("variant").swallowed_fraction.median()
    lost = table.groupby("variant").lost_mass_fraction.median()
    others = [v for v in share.index if v not in ("bf16", "fp32")]
    worst = max(others, key=lambda v: share[v]) if others else None
    text = (f"Inside the trained models, a bf16 stream rounds {100 * share.get('bf16', float('nan')):.1f}% of the sublayers' non-zero "
            f"updates away entirely and loses {100 * lost.get('bf16', float('nan')):.2f}% of their mass; the fp32 stream "
            f"{100 * share.get('fp32', float('nan')):.2f}% and {100 * lost.get('fp32', float('nan')):.4f}% (medians over layers and runs)")
    if worst is not None:
        text += f"; of the narrower formats {worst} swallows most ({100 * share[worst]:.1f}%)"
    return [text + "."]


def envelope(config: dict, pairs) -> list[str]:
    table = _table("envelope")
    if table is None:
        return [Missing("The residual envelope is not available: the envelope analysis has not run.")]
    reach = table.groupby("run").agg(top=("max", "max"), bottom=("min", "min"))
    parts = []
    for shape, baseline, other in pairs:
        if other.endswith("-streamback") and {baseline, other} <= set(reach.index):
            b, s = reach.loc[baseline], reach.loc[other]
            parts.append(f"{shape}: baseline {b.bottom:.0f} to {b.top:.0f}, StreamBack {s.bottom:.0f} to {s.top:.0f}")
    return ["The stream's reach on a validation batch (its minimum and maximum over all layer boundaries): " + "; ".join(parts) + "."] if parts else []


def sentences(config: dict, pairs) -> list:
    """The answer, from loss to benchmarks to the mechanisms behind them."""
    return [compared(config), *loss(config), *benchmarks(config), *layer_error(), *swallowed(), *envelope(config, pairs)]
