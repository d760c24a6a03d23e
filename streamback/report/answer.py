"""The study's answer, written from its tables every time (never hard-coded).

First (`headline`) at most five short sentences: the primary test's answer to the paper's
question (results/tables/primary.csv: the final validation loss pooled over the shapes, seeds as
units, with its equivalence verdict against the paper's band), the mechanism (the last layer's
error, fp32 against bf16), the envelope, the swallowed share and what the tier cannot resolve.
Then, in detail (`sentences`), each stage's CSV under results/tables/: the final loss
differences (`loss_difference`) and the benchmark comparisons (`benchmark_pairs`), across the
training seeds first (their t intervals, bootstraps over seeds then windows or items, and verdicts
against the seed-to-seed spread) and then within each seed (paired intervals, Holm's correction);
the layer error at the last layer boundary (`layer_error`), the share of updates a stream rounds
away (`swallowed`) and the reach of the stream (`envelope`). Every interval over seeds takes one
value a seed: a seed's paired difference, or the mean of the seed's runs (both blocks share its
weights and batches: `over_seeds`), the shapes as strata. Beside each loss verdict, what the tier
resolves and the seeds the paper's band would take; the benchmark answer leads with the tasks that
can rank the models (`task_snr`). With one seed, a sentence says that training's own randomness is
not covered. A table that is not there gives a sentence saying so.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from streamback import layout, stats
from streamback.html_report import Missing
from streamback.runs import comparison_name, comparisons, run_matrix


def _table(name: str) -> pd.DataFrame | None:
    path = layout.table(name)
    if not path.exists():
        return None
    table = pd.read_csv(path)
    return table.assign(seed=table.seed.astype(str)) if "seed" in table.columns else table


def _seeds(table: pd.DataFrame) -> str:
    """'3 seeds' / 'one seed': the training seeds the per-run rows of `table` come from."""
    n = table.seed[table.seed != layout.ALL_SEEDS].nunique() if "seed" in table.columns else 1
    return "one seed" if n == 1 else f"{n} seeds"


def compared(config: dict) -> str:
    """What was compared, in one sentence, from the run matrix."""
    train = config["train"]
    runs = train["runs"]
    shapes = ", ".join(runs["shapes"])
    seeds = runs["seeds"] if runs["seeds"] is not None else [train["seed"]]
    trained = (
        f"each trained with {len(seeds)} training seeds ({', '.join(map(str, seeds))}: each fixes the initial weights "
        f"and the batch "
        "order, the same for both blocks of a shape)"
        if len(seeds) > 1
        else f"each trained once, from seed {seeds[0]}"
    )
    text = (
        "Compared: the baseline block (its residual stream in bf16) and the StreamBack block (stream in fp32, "
        f"sublayers "
        f"still in bf16) on {len(runs['shapes'])} shapes ({shapes}), each run on {train['tokens']:,} tokens, {trained}"
    )
    if runs["streams"]:
        where = ", ".join(runs["stream_shapes"] or runs["shapes"])
        stream_seeds = runs["stream_seeds"] if runs["stream_seeds"] is not None else seeds
        text += (
            f"; and StreamBack with its stream kept below bf16 ({', '.join(runs['streams'])}) on {where}, "
            f"{'with seed' if len(stream_seeds) == 1 else 'with seeds'} {', '.join(map(str, stream_seeds))}"
        )
    return (
        text + ". Differences are baseline minus the other run: positive means the other run is better, as in the seed."
    )


def resolution(mde: float, seeds: float, unit: str, band: str, scale: float = 1.0, digits: int = 4) -> str:
    """'this tier resolves |Δ| ≥ X; <band> would take N seeds at this spread', from a row over seeds:
    its `mde` and the seeds `band` (e.g. "the paper's band of ±0.001 nats") takes; differences
    times `scale` in `unit`."""
    if pd.isna(mde):
        return "what this tier resolves needs two seeds or more"
    needed = "more than 100,000 seeds" if pd.isna(seeds) else f"{int(seeds):,} seeds"
    return f"this tier resolves |Δ| ≥ {scale * mde:.{digits}f} {unit}; {band} would take {needed} at this spread"


def _p(row, name: str) -> str:
    value = getattr(row, name, math.nan)
    return "n/a" if pd.isna(value) else f"{value:.2g}"


def _family(row) -> str:
    family = getattr(row, "family", "")
    return "family" if pd.isna(family) or not family else f"family '{family}'"


def _verdict(lo: float, hi: float) -> str:
    return "distinguishable from zero" if lo > 0 or hi < 0 else "not distinguishable from zero"


def loss(config: dict) -> list[str]:
    table = _table("loss_difference")
    if table is None:
        return [Missing("The loss differences are not available: the loss-difference analysis has not run.")]
    val = table[table.split == "val"]
    over, per_seed = val[val.seed == layout.ALL_SEEDS], val[val.seed != layout.ALL_SEEDS]
    confidence, band = config["analysis"]["confidence"], config["analysis"]["band"]
    out = []
    for row in over[over.comparison == "streamback"].itertuples():
        d = row.final_difference
        if row.seeds > 1:
            out.append(
                f"On {row.shape}, over {row.seeds} training seeds, StreamBack's final validation loss is {abs(d):.4f} "
                f"nats "
                f"{'lower' if d > 0 else 'higher'} than the baseline's on average ({confidence:.0%} t interval over "
                f"seeds "
                f"{row.ci_low:+.4f} to {row.ci_high:+.4f}; bootstrap over seeds then windows {row.boot_low:+.4f} to "
                f"{row.boot_high:+.4f}; the baseline's own loss varies by sd {row.baseline_sd:.4f} from seed to seed): "
                f"{row.verdict.split(':')[0]} (Holm p {_p(row, 'p_holm')} over the {_family(row)}); against the "
                f"paper's band of ±{band:g}: {getattr(row, 'equivalence', 'not tested')}; "
                + resolution(row.mde, row.seeds_for_band, "nats", f"the paper's band of ±{band:g} nats")
                + "."
            )
        else:
            seed = per_seed[(per_seed["shape"] == row.shape) & (per_seed.comparison == "streamback")].iloc[0]
            out.append(
                f"On {row.shape}, StreamBack's final validation loss is {abs(d):.4f} nats "
                f"{'lower' if d > 0 else 'higher'} than "
                f"the baseline's ({confidence:.0%} CI of the difference {seed.ci_low:+.4f} to {seed.ci_high:+.4f}, "
                f"paired over "
                f"the same validation windows): {_verdict(seed.ci_low, seed.ci_high)}; one seed cannot test "
                f"equivalence within the paper's band of ±{band:g}; what this tier resolves needs two seeds or more."
            )
    if len(out) and (over.seeds <= 1).all():
        out.append(
            "These intervals cover the validation windows only: each run was trained once, from seed "
            f"{config['train']['seed']}, "
            "so a difference near the band may also be the two training runs' own randomness, which no interval here "
            "includes "
            "(train.runs.seeds trains more seeds)."
        )
    elif len(out):
        flips = per_seed[per_seed.comparison == "streamback"]
        real = flips[(flips.ci_low > 0) | (flips.ci_high < 0)]
        out.append(
            f"Within single seeds, {len(real)} of {len(flips)} StreamBack comparisons are distinguishable from zero "
            f"over the "
            "validation windows; the intervals over seeds above add training's own randomness, the one the verdicts go "
            "by."
        )
    below = over[over.comparison != "streamback"]
    if len(below):
        parts = [
            f"{r.comparison.removeprefix('streamback-')} {r.final_difference:+.4f} "
            + (
                f"({r.ci_low:+.4f} to {r.ci_high:+.4f} over {r.seeds} seeds"
                if r.seeds > 1
                else "("
                + "{:+.4f} to {:+.4f}".format(
                    *per_seed[(per_seed["shape"] == r.shape) & (per_seed.comparison == r.comparison)][
                        ["ci_low", "ci_high"]
                    ].iloc[0]
                )
                + " over windows, one seed"
            )
            + f"{', ' + r.verdict.split(':')[0] if r.seeds > 1 else ''})"
            for r in below.itertuples()
        ]
        out.append(
            f"Below bf16 (on {', '.join(dict.fromkeys(below['shape']))}), the baseline's final validation loss minus "
            f"each "
            f"stream's, in nats: " + "; ".join(parts) + "."
        )
    return out


def task_signal() -> list[str]:
    """Which tasks can rank the study's models, from task_snr.csv: those that can first, by SNR,
    then those that cannot, named; saying where the noise came from (the runs' last checkpoints
    or the arms' training seeds)."""
    table = _table("task_snr")
    if table is None or table.snr.isna().all():
        return []
    table = table.dropna(subset=["snr"])
    label = table.task + " " + table.metric + table["filter"].map(lambda f: "" if f == "none" else f" ({f})")
    decide = [
        f"{name} (SNR {snr:.1f}, decision accuracy {100 * acc:.0f}%)"
        for name, snr, acc, ok in zip(label, table.snr, table.decision_accuracy, table.can_rank)
        if ok
    ]
    cannot = [
        f"{name} (SNR {snr:.1f}, {100 * acc:.0f}%)"
        for name, snr, acc, ok in zip(label, table.snr, table.decision_accuracy, table.can_rank)
        if not ok
    ]
    source = table.noise_from.iloc[0]
    models, model = ("run arms", "arm") if source == "training seeds" else ("runs", "run")
    text = (
        f"Over the {int(table.models.max())} {models}, with each {model}'s noise from its {source} "
        f"(signal-and-noise's SNR: the {models}' spread over their own sd), {len(decide)} of {len(table)} task "
        "metrics can rank these models: " + ("; ".join(decide) if decide else "none")
    )
    if cannot:
        text += f". Cannot rank at this scale (SNR below {1.96 * 2**0.5:.2f}): " + "; ".join(cannot)
    return [text + "."]


def benchmarks(config: dict) -> list[str]:
    pairs = _table("benchmark_pairs")
    if pairs is None:
        return [Missing("The benchmark comparison is not available: the evaluation has not run.")]
    alpha = config["eval"]["pairs"]["alpha"]
    over, per_seed = pairs[pairs.seed == layout.ALL_SEEDS], pairs[pairs.seed != layout.ALL_SEEDS]
    out = task_signal()
    if len(over) and (over.seeds > 1).any():
        n, tests = int(over.seeds.max()), int(over.tests.max())
        consistent = over[over.verdict.str.startswith("consistent")]
        head = (
            f"Over {n} training seeds, {len(consistent)} of {len(over)} benchmark comparisons of a run against its "
            f"shape's "
            f"baseline ({over.task.nunique()} tasks) are consistent across seeds: the t interval over seeds and the "
            f"bootstrap "
            "over seeds then items both exclude 0"
        )
        floor = (
            f"the baselines' own scores vary by a median sd of {100 * over.baseline_sd.median():.1f} points from seed "
            f"to seed"
        )
        if consistent.empty:
            out.append(f"{head}: none; {floor}.")
        else:
            listed = "; ".join(
                f"{r.run} on {r.task} {r.metric} ({100 * r['diff']:+.1f} points, {100 * r.ci_low:+.1f} to "
                f"{100 * r.ci_high:+.1f} "
                f"over seeds)"
                for _, r in consistent.iterrows()
            )
            out.append(f"{head}: {listed}; {floor}.")
        enough = next(k for k in range(2, 64) if tests * 2.0 / 2**k <= alpha)
        significant = int((over.p_holm <= alpha).sum())
        out.append(
            f"The exact sign-flip test over {n} seeds cannot give p below {2 / 2**n:.2g}, so after Holm over a "
            f"comparison's "
            f"{tests} tests {'no difference can reach' if tests * 2 / 2**n > alpha else f'{significant} reach'} alpha "
            f"{alpha:g}"
            f"{f' (that takes {enough} seeds)' if tests * 2 / 2**n > alpha else ''}."
        )
        mde = 100 * over.mde.dropna()
        target = config["eval"]["pairs"]["target"]
        needed = over.seeds_for_target.dropna()
        if len(mde):
            out.append(
                f"Over the seeds this tier resolves |Δ| ≥ {mde.min():.1f} to {mde.max():.1f} points, by task (median "
                f"{mde.median():.1f}); a target of {100 * target:g} points (eval.pairs.target) would take "
                + (
                    f"{int(needed.min()):,} to {int(needed.max()):,} seeds at these spreads"
                    if len(needed)
                    else "more than 100,000 seeds"
                )
                + "."
            )
    real = per_seed[per_seed.p_holm <= alpha]
    seeds = per_seed.seed.nunique()
    head = (
        f"{'Within single seeds, of' if seeds > 1 else 'Of'} {len(per_seed)} benchmark comparisons of a run against "
        f"its shape's baseline "
        f"on the same items ({per_seed.task.nunique()} tasks{f', {seeds} seeds' if seeds > 1 else ''}), {len(real)} "
        f"{'is' if len(real) == 1 else 'are'} distinguishable from noise after Holm's correction over each run's tasks "
        f"(alpha {alpha:g})"
    )
    if real.empty:
        smallest = per_seed.mdd.dropna()
        detectable = (
            f"; with these item counts only differences of about {100 * smallest.min():.0f} to "
            f"{100 * smallest.max():.0f} points "
            "would be found 80% of the time"
            if len(smallest)
            else ""
        )
        out.append(head + detectable + ".")
    else:
        out.append(f"{head}; the table of per-seed tests under Benchmarks lists them.")
    if seeds == 1:
        out.append(
            "Each run was trained once, so these tests cover the items only, not training's own randomness "
            "(train.runs.seeds)."
        )
    return out + above_chance()


def above_chance() -> list[str]:
    """How many tasks with a chance level each baseline run beats by its 95% interval (lm-eval's stderr)."""
    scores = _table("benchmarks")
    if scores is None or "chance" not in scores.columns:
        return []
    scored = scores[(scores.block == "baseline") & scores.chance.notna() & scores.stderr.notna()]
    if scored.empty:
        return []
    beats = scored.assign(beats=scored.value - 1.96 * scored.stderr > scored.chance).groupby("run").beats.sum()
    tasks = scored.groupby(["task", "metric"]).ngroups
    return [
        f"The baseline runs beat chance by their 95% intervals on {int(beats.min())} to {int(beats.max())} of the "
        f"{tasks} task metrics "
        f"that have one ({', '.join(sorted(set(scored.task)))}), over {len(beats)} runs."
    ]


def over_runs(values, fmt, what: str = "seeds") -> str:
    """'95% t interval L to H over n seeds; they resolve |Δ| ≥ X' for independent values, one a
    training seed (a seed's paired difference; never two runs of one seed: `over_seeds` takes
    per-run values): the t interval of their mean and its minimum detectable effect (80% power,
    two-sided 5%); `fmt` formats a value."""
    values = [float(v) for v in values if pd.notna(v) and math.isfinite(v)]
    if len(values) < 2:
        return f"one {what[:-1]}: no interval"
    summary = stats.across_seeds(values, 0.95)
    mde = stats.seed_mde(summary["sd"], summary["n"])
    resolves = f"; they resolve |Δ| ≥ {fmt(mde).lstrip('+')}" if pd.notna(mde) else "; no spread between them"
    return f"95% t interval {fmt(summary['low'])} to {fmt(summary['high'])} over {summary['n']} {what}{resolves}"


def seed_strata(per_run: pd.Series, matrix: dict) -> dict[str, list[float]]:
    """shape -> one value a training seed from per-run values (a Series indexed by run): the mean
    of the seed's runs of that shape (both blocks share the seed's weights and batches, so they are
    one unit: `stats.per_seed`); runs outside the matrix and NaNs left out."""
    keyed = [
        (matrix[run].shape, matrix[run].seed, float(v))
        for run, v in per_run.items()
        if run in matrix and pd.notna(v) and math.isfinite(v)
    ]
    strata = {}
    for shape in dict.fromkeys(k[0] for k in keyed):
        mine = [(seed, v) for s, seed, v in keyed if s == shape]
        strata[shape] = stats.per_seed([v for _, v in mine], [seed for seed, _ in mine]).tolist()
    return strata


def over_seeds(per_run: pd.Series, matrix: dict) -> dict:
    """`stats.stratified_mean` of per-run values with the seeds as units and the shapes as strata
    (`seed_strata`); NaNs where no seed has a value."""
    strata = seed_strata(per_run, matrix)
    if not any(strata.values()):
        return {"seeds": 0, "strata": 0, "estimate": math.nan, "low": math.nan, "high": math.nan, "mde": math.nan}
    return stats.stratified_mean(strata)


def seeds_interval(summary: dict, fmt) -> str:
    """'95% t interval L to H over n seeds of k shapes, a seed the mean of its runs; they resolve |Δ| ≥ X'."""
    if summary["seeds"] < 2 or not math.isfinite(summary["low"]):
        return "one seed a shape: no interval"
    resolves = f"; they resolve |Δ| ≥ {fmt(summary['mde']).lstrip('+')}" if pd.notna(summary["mde"]) else "; no spread"
    return (
        f"95% t interval {fmt(summary['low'])} to {fmt(summary['high'])} over {summary['seeds']} seeds of "
        f"{summary['strata']} shape{'s' if summary['strata'] != 1 else ''}, a seed the mean of its runs{resolves}"
    )


def _last_error_ratio(table: pd.DataFrame) -> pd.Series:
    """Per run, the bf16 stream's largest activation error at the last layer boundary over the fp32 stream's."""
    acts = table[table.kind == "activations"]
    last = acts[acts.layer == acts.groupby("run").layer.transform("max")].pivot_table(
        index="run", columns="variant", values="max_abs_error"
    )
    if not {"bf16", "fp32"} <= set(last.columns):
        return pd.Series(dtype=float)
    return (last["bf16"] / last["fp32"]).replace([float("inf")], float("nan")).dropna()


def layer_error(matrix: dict) -> list[str]:
    table = _table("layer_error")
    if table is None:
        return [Missing("The per-layer error is not available: the layer-error analysis has not run.")]
    ratio = _last_error_ratio(table)
    if ratio.empty:
        return []
    acts = table[table.kind == "activations"]
    logs = np.log(ratio[ratio > 0])
    flips = acts.groupby(["run", "variant"]).sign_flip_fraction.median().unstack()
    medians = acts.groupby("variant").sign_flip_fraction.median()
    pooled = over_seeds(logs, matrix)
    text = (
        "Against a full-precision forward pass of the same weights, the fp32 stream's largest error at the last layer "
        f"boundary is "
        f"{ratio.median():.1f} times smaller than the bf16 stream's (median over {len(ratio)} runs of {_seeds(table)}; "
        f"range {ratio.min():.1f} to "
        f"{ratio.max():.1f}; geometric mean {np.exp(pooled['estimate']):.1f}, "
        + seeds_interval(pooled, lambda x: f"×{np.exp(x):.2f}").replace("|Δ| ≥ ×", "a ratio beyond ×")
        + f"), and {100 * medians.get('fp32', float('nan')):.2f}% of the stream's coordinates flip sign against "
        f"{100 * medians.get('bf16', float('nan')):.2f}% with bf16 (medians over layers and runs"
    )
    if {"bf16", "fp32"} <= set(flips.columns):
        gap = 100 * (flips["bf16"] - flips["fp32"])
        text += "; bf16 minus fp32, in points of coordinates: " + seeds_interval(
            over_seeds(gap, matrix), lambda x: f"{x:+.3f}"
        )
    return [text + ")."]


def swallowed(matrix: dict) -> list[str]:
    table = _table("swallowed")
    if table is None:
        return [Missing("The swallowed updates are not available: the swallowed analysis has not run.")]
    share = table.groupby("variant").swallowed_fraction.median()
    lost = table.groupby("variant").lost_mass_fraction.median()
    per_run = table.groupby(["run", "variant"]).swallowed_fraction.median().unstack()
    others = [v for v in share.index if v not in ("bf16", "fp32")]
    worst = max(others, key=lambda v: share[v]) if others else None
    text = (
        f"Inside the trained models, a bf16 stream rounds {100 * share.get('bf16', float('nan')):.1f}% of the "
        f"sublayers' non-zero "
        f"updates away entirely and loses {100 * lost.get('bf16', float('nan')):.2f}% of their mass; the fp32 stream "
        f"{100 * share.get('fp32', float('nan')):.2f}% and {100 * lost.get('fp32', float('nan')):.4f}% (medians over "
        f"layers and "
        f"{table.run.nunique()} runs of {_seeds(table)}"
    )
    if {"bf16", "fp32"} <= set(per_run.columns):
        gap = 100 * (per_run["bf16"] - per_run["fp32"])
        text += (
            "; the swallowed share, bf16 minus fp32, in points: "
            f"{seeds_interval(over_seeds(gap, matrix), lambda x: f'{x:+.2f}')})"
        )
    else:
        text += ")"
    if worst is not None:
        text += f"; of the narrower formats {worst} swallows most ({100 * share[worst]:.1f}%)"
    return [text + "."]


def envelope(config: dict, pairs) -> list[str]:
    table = _table("envelope")
    if table is None:
        return [Missing("The residual envelope is not available: the envelope analysis has not run.")]
    reach = table.groupby("run").agg(top=("max", "max"), bottom=("min", "min"))
    arms = {}  # (shape, baseline or StreamBack) -> reaches of its seeds
    gaps = {}  # shape -> StreamBack's top minus the baseline's, per seed
    for shape, baseline, other in pairs:
        if other.removeprefix(f"{shape}-").split("-seed")[0] == "streamback" and {baseline, other} <= set(reach.index):
            arms.setdefault((shape, "baseline"), []).append(reach.loc[baseline])
            arms.setdefault((shape, "StreamBack"), []).append(reach.loc[other])
            gaps.setdefault(shape, []).append(reach.loc[other].top - reach.loc[baseline].top)
    parts = {}
    for (shape, arm), seen in arms.items():
        low, high = min(r.bottom for r in seen), max(r.top for r in seen)
        parts.setdefault(shape, []).append(f"{arm} {low:.0f} to {high:.0f}")
    if not parts:
        return []
    paired = [
        f"{shape}: {np.mean(g):+.1f} ({over_runs(g, lambda x: f'{x:+.1f}', 'seeds')})" for shape, g in gaps.items()
    ]
    return [
        "The stream's reach on a validation batch (its minimum and maximum over all layer boundaries, and over "
        f"{_seeds(table)}): "
        + "; ".join(f"{shape}: {', '.join(p)}" for shape, p in parts.items())
        + ". StreamBack's maximum minus the baseline's, per seed: "
        + "; ".join(paired)
        + "."
    ]


def verdicts() -> pd.DataFrame | None:
    """The verdict table: a row per comparison and quantity over the seeds (final losses in nats,
    benchmarks in points), with its intervals, its minimum detectable effect, the seeds a band
    takes (the paper's for losses, eval.pairs.target for benchmarks) and the verdict's first words;
    None where neither table is there."""
    loss, pairs = _table("loss_difference"), _table("benchmark_pairs")
    rows = []
    for r in [] if loss is None else loss[loss.seed == layout.ALL_SEEDS].to_dict("records"):
        rows.append(
            {
                "shape": r["shape"],
                "comparison": r["comparison"],
                "quantity": f"final {r['split']} loss (nats)",
                "seeds": r["seeds"],
                "difference": r["final_difference"],
                "t interval": _interval(r["ci_low"], r["ci_high"], 1, 4),
                "bootstrap": _interval(r.get("boot_low"), r.get("boot_high"), 1, 4),
                "resolves |Δ| ≥": _ranged(r, "mde", 1, 4),
                "seeds for the band": _seeds_cell(r, "seeds_for_band", r.get("band"), 1, "nats"),
                "family": r.get("family", ""),
                "Holm p": _value(r.get("p_holm"), 1, 3),
                "verdict": str(r["verdict"]).split(":")[0],
                "equivalence": r.get("equivalence", ""),
            }
        )
    for r in [] if pairs is None else pairs[pairs.seed == layout.ALL_SEEDS].to_dict("records"):
        filt = "" if r["filter"] == "none" else f" ({r['filter']})"
        rows.append(
            {
                "shape": r["shape"],
                "comparison": r["comparison"],
                "quantity": f"{r['task']} {r['metric']}{filt} (points)",
                "seeds": r["seeds"],
                "difference": 100 * r["diff"],
                "t interval": _interval(r["ci_low"], r["ci_high"], 100, 1),
                "bootstrap": _interval(r["boot_low"], r["boot_high"], 100, 1),
                "resolves |Δ| ≥": _ranged(r, "mde", 100, 1),
                "seeds for the band": _seeds_cell(r, "seeds_for_target", r.get("target"), 100, "points"),
                "family": r.get("family", ""),
                "Holm p": _value(r.get("p_holm"), 1, 3),
                "verdict": str(r["verdict"]).split(":")[0],
                "equivalence": "",
            }
        )
    return pd.DataFrame(rows).round({"difference": 4}) if rows else None


def _value(x, scale: float, digits: int) -> str:
    return "" if x is None or pd.isna(x) else f"{scale * x:.{digits}f}"


def _interval(low, high, scale: float, digits: int) -> str:
    return "" if low is None or pd.isna(low) else f"{scale * low:+.{digits}f} to {scale * high:+.{digits}f}"


def _ranged(r: dict, name: str, scale: float, digits: int) -> str:
    """'X (L to H)': a value of a row over seeds with its range from the sd's chi-square interval."""
    value = _value(r.get(name), scale, digits)
    low, high = _value(r.get(f"{name}_low"), scale, digits), _value(r.get(f"{name}_high"), scale, digits)
    return f"{value} ({low} to {high})" if value and low and high else value


def _count(x) -> str:
    return "more than 100,000" if x is None or pd.isna(x) else f"{int(x):,}"


def _seeds_cell(r: dict, name: str, band, scale: float, unit: str) -> str:
    """'±0.001 nats: 12 (3 to 400)': the seeds `band` takes, with the range the sd's interval gives."""
    if band is None or pd.isna(band) or r["seeds"] < 2:
        return ""
    cell = f"±{scale * band:g} {unit}: {_count(r.get(name))}"
    if f"{name}_low" in r:
        cell += f" ({_count(r.get(f'{name}_low'))} to {_count(r.get(f'{name}_high'))})"
    return cell


def sentences(config: dict, pairs) -> list:
    """The answer in detail, from loss to benchmarks to the mechanisms behind them."""
    matrix = run_matrix(config["train"])
    return [
        compared(config),
        *loss(config),
        *benchmarks(config),
        *layer_error(matrix),
        *swallowed(matrix),
        *envelope(config, pairs),
    ]


# the primary test's verdict (primary.csv's verdict_band, `stats.equivalence_verdict`) -> how the first sentence opens
LEADS = {
    "different": "On this tier the fp32 stream changes training",
    "different, but within": "On this tier the fp32 stream changes training, but by less than the paper's band",
    "equivalent within": "On this tier the fp32 stream does not change training beyond the paper's band",
    "inconclusive": "This tier cannot tell whether the fp32 stream changes training",
}


def lead(verdict: str) -> str:
    """The first sentence's opening words for a primary verdict ("different, but within ±X" -> its LEADS entry)."""
    key = next(k for k in sorted(LEADS, key=len, reverse=True) if verdict.startswith(k))
    return LEADS[key]


def primary_sentence(row) -> str:
    """The page's first sentence: the paper's question answered from the primary test (a row of primary.csv)."""
    d = row.estimate
    units = f"{int(row.seeds)} seeds of {int(row.strata)} shape{'s' if row.strata != 1 else ''}"
    numbers = (
        f"95% t interval {row.low:+.4f} to {row.high:+.4f} nats over {units}, exact sign-flip p = {row.p:.2g}"
        if pd.notna(row.low)
        else f"over {units}: one seed a shape gives no interval"
    )
    return (
        f"{lead(row.verdict_band)}: StreamBack's final validation loss is {abs(d):.4f} nats "
        f"{'lower' if d > 0 else 'higher'} than the baseline's ({numbers}; "
        f"against the paper's ±{row.band:g} nats: {row.verdict_band})."
    )


def headline(config: dict) -> list:
    """At most five short sentences before any figure: the primary test's answer, the mechanism (the
    last layer's error), the envelope, the swallowed share, and what the tier cannot resolve; every
    interval over seeds, a seed the mean of its runs."""
    path = layout.table(layout.PRIMARY_TABLE)
    primary = pd.read_csv(path) if path.exists() else None
    if primary is None or primary.empty:
        return [Missing(f"The primary test is not available: {path} is missing (rule analyze_loss_difference).")]
    row = primary.iloc[0]
    out = [primary_sentence(row)]
    matrix = run_matrix(config["train"])
    errors = _table("layer_error")
    ratio = _last_error_ratio(errors) if errors is not None else pd.Series(dtype=float)
    if len(ratio):
        pooled = over_seeds(np.log(ratio[ratio > 0]), matrix)
        out.append(
            f"The mechanism: the fp32 stream's largest error at the last layer is {np.exp(pooled['estimate']):.1f} "
            f"times smaller than the bf16 stream's (×{np.exp(pooled['low']):.1f} to ×{np.exp(pooled['high']):.1f} "
            f"over {pooled['seeds']} seeds), as rounding predicts for any weights."
        )
    envelope_table = _table("envelope")
    if envelope_table is not None:
        reach = envelope_table.groupby("run")["max"].max()
        gaps = pd.Series(
            {
                o: reach[o] - reach[b]
                for _, b, o in comparisons(matrix)
                if comparison_name(matrix[o]) == "streamback" and {b, o} <= set(reach.index)
            },
            dtype=float,
        )
        if len(gaps):
            pooled = over_seeds(gaps, matrix)
            out.append(
                f"The envelope: StreamBack's largest stream value minus the baseline's is {pooled['estimate']:+.1f} "
                f"({pooled['low']:+.1f} to {pooled['high']:+.1f} over {pooled['seeds']} seeds)."
            )
    swallow = _table("swallowed")
    if swallow is not None:
        per_run = swallow.groupby(["run", "variant"]).swallowed_fraction.median().unstack()
        if {"bf16", "fp32"} <= set(per_run.columns):
            pooled = over_seeds(100 * (per_run["bf16"] - per_run["fp32"]), matrix)
            out.append(
                f"A bf16 stream swallows {pooled['estimate']:.1f} points more of the sublayers' updates than an fp32 "
                f"one ({pooled['low']:.1f} to {pooled['high']:.1f} over {pooled['seeds']} seeds)."
            )
    if pd.notna(row.mde):
        needed = "more than 100,000" if pd.isna(row.seeds_for_band) else f"{int(row.seeds_for_band):,}"
        ends = [
            ("more than 100,000" if pd.isna(x) else f"{int(x):,}")
            for x in (row.seeds_for_band_low, row.seeds_for_band_high)
        ]
        out.append(
            f"This tier cannot resolve differences below {row.mde:.4f} nats ({row.mde_low:.4f} to {row.mde_high:.4f} "
            f"as the sd's 95% interval allows); the paper's ±{row.band:g} nats would take {needed} seeds "
            f"({ends[0]} to {ends[1]})."
        )
    else:
        out.append("What this tier resolves needs two seeds or more.")
    return out


def primary_view() -> pd.DataFrame | None:
    """primary.csv as the page shows it (None where it is not there)."""
    path = layout.table(layout.PRIMARY_TABLE)
    if not path.exists():
        return None
    table = pd.read_csv(path)
    return table.round(5) if len(table) else None
