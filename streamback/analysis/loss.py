"""Loss differences: baseline minus the other run of the same shape (StreamBack, or a StreamBack run
with another stream format), so a positive difference means the other run is better, as in the paper.

Curves: from the two runs' metrics.jsonl, step by step (both runs see the same batches at the same
step: batches are a pure function of (seed, step)), the training loss difference and, where both
logged it, the validation loss difference; raw, and smoothed by a trailing mean over the last
`smooth_steps` optimizer steps; thinned to at most `points` steps per curve (the smoothing is done
on every step first).

Final difference: the two final models on the same windows of each split (the first `windows`
windows; of the val split these are the windows the trainer's validation loss uses), one mean
loss per window (`streamback.train.validation.window_losses`), and a paired t interval of the mean
per-window difference (`streamback.stats.paired_difference`), per training seed. Across seeds (the
row whose seed is `all`): the mean of the seeds' differences with a t interval over seeds and a
hierarchical bootstrap over seeds then windows (`boot_low`, `boot_high`), the sd of the seeds'
differences with its chi-square interval (`sd_low`, `sd_high`), the baseline's own seed-to-seed sd of its loss (`baseline_sd`, the noise floor) and
a verdict in words (`streamback.stats.seed_verdict`), the exact sign-flip p (`p_seeds`), the
minimum detectable effect at analysis.power (`mde`, `streamback.stats.seed_mde`: from the seeds'
sd, never below the windows' own noise `within_se`) and the seeds that analysis.band and
analysis.target (`band`, `target`) would take at that spread (`seeds_for_band`,
`seeds_for_target`; empty past 100,000), each with its range from the sd's interval (`mde_low`,
`mde_high`, `seeds_for_band_low`, ...), and, as these verdicts are secondary, the family they are
Holm-adjusted over (`family`: the shapes of a comparison and split) and `p_holm`, with the two
one-sided tests of equivalence within analysis.band (`tost_p_band`) and `equivalence`, the
verdict in words (`stats.equivalence_verdict`; "different" needs the t interval to exclude 0 and
the Holm p to be at most 1 - confidence). The primary test
(`primary_table`, results/tables/primary.csv) pools the shapes. The curves' across-seeds rows are the mean
over seeds at each step logged by all of them, with the seeds' range of the smoothed difference
(`band_low`, `band_high`).

Accumulation (`accumulation_rows`): does the lead grow over training or shrink? Per seed, the
slope per step of the smoothed train-loss difference (paired by batch: the two runs of a seed read
the same batches) over the second half of training, from every step of metrics.jsonl
(`streamback.stats.accumulation_slope`); over the seeds (seed `all`), the mean slope with its t
interval, the sign-flip p, what it adds over the second half (`change`) and the verdict
(`streamback.stats.accumulation`): "grows" is the drift note's long-horizon effect, "shrinks" a
faster start that the baseline catches up.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from streamback import layout, stats
from streamback.errors import StreambackError
from streamback.model.weights import load_model
from streamback.runs import comparison_name
from streamback.train.batches import num_windows, val_windows
from streamback.train.validation import window_losses

trailing_mean = stats.trailing_smooth  # the curves' smoothing, the accumulation test's: one home, stats


def thin(n: int, points: int) -> np.ndarray:
    """Indices of at most `points` of n rows, evenly spaced, the last one always kept."""
    keep = np.arange(0, n, max(1, math.ceil(n / points)))
    return np.unique(np.append(keep, n - 1)) if n else keep


def loss_curves(baseline: list[dict], other: list[dict], smooth_steps: int, points: int) -> pd.DataFrame:
    """Columns split, step, tokens, difference (baseline - other), smoothed; from two runs' metrics records."""
    frames = []
    for split, key in (("train", "loss"), ("val", "val_loss")):
        a = pd.DataFrame(
            [(r["step"], r["tokens"], r[key]) for r in baseline if key in r], columns=["step", "tokens", "a"]
        )
        b = pd.DataFrame([(r["step"], r[key]) for r in other if key in r], columns=["step", "b"])
        both = a.merge(b, on="step").sort_values("step")
        difference = (both.a - both.b).to_numpy(dtype=np.float64)
        smoothed = trailing_mean(both.step.to_numpy(), difference, smooth_steps)
        keep = thin(len(both), points)
        frames.append(
            pd.DataFrame(
                {
                    "split": split,
                    "step": both.step.to_numpy()[keep],
                    "tokens": both.tokens.to_numpy()[keep],
                    "difference": difference[keep],
                    "smoothed": smoothed[keep],
                }
            )
        )
    return pd.concat(frames, ignore_index=True)


def split_windows(dataset, seq_len: int, count: int, split: str) -> np.ndarray:
    """The first `count` windows of `dataset` (one split of a TokenDataset)."""
    n = num_windows(dataset.num_tokens, seq_len)
    if n < count:
        raise StreambackError(
            f"the {split} split holds {n} windows of {seq_len} tokens, fewer than analysis.loss_windows = {count}"
        )
    return val_windows(n, count, 0, 1)


def model_window_losses(
    trained, dataset, windows: np.ndarray, seq_len: int, micro_batch_size: int, device
) -> np.ndarray:
    """The model as trained (a model file, or what `read_model` returned): its mean loss (nats) on each window, fp64."""
    model = load_model(trained, device=device)
    return window_losses(model, dataset, windows, seq_len, micro_batch_size, device).cpu().numpy()


BOOTSTRAP_RESAMPLES = 10000


def _nats(x: float, sign: bool = True) -> str:
    return f"{x:+.4f}" if sign else f"{x:.4f}"


def final_differences(pairs, matrix, losses: dict, curves: pd.DataFrame, cfg: dict, windows: int) -> pd.DataFrame:
    """The final loss differences of `pairs` ((shape, baseline, other) runs), a row per seed and
    split from each pair's per-window `losses[(run, split)]`, then a row over the seeds of each
    shape, comparison and split (see the module docstring); `cfg`: the analysis section."""
    confidence = cfg["confidence"]
    alpha, power = 1 - confidence, cfg["power"]
    rows, groups = [], {}
    for shape, baseline, other in pairs:
        comparison, seed = comparison_name(matrix[other]), matrix[other].seed
        for split in ("train", "val"):
            a, b = (
                np.asarray(losses[baseline, split], dtype=np.float64),
                np.asarray(losses[other, split], dtype=np.float64),
            )
            mean, low, high = stats.paired_difference(a, b, confidence)
            logged = curves[
                (curves["shape"] == shape)
                & (curves.comparison == comparison)
                & (curves.seed == seed)
                & (curves.split == split)
            ].smoothed
            real = low > 0 or high < 0
            rows.append(
                {
                    "shape": shape,
                    "comparison": comparison,
                    "seed": seed,
                    "split": split,
                    "final_difference": mean,
                    "ci_low": low,
                    "ci_high": high,
                    "seeds": 1,
                    "windows": windows,
                    "baseline_loss": float(a.mean()),
                    "compared_loss": float(b.mean()),
                    "logged_difference": float(logged.iloc[-1]) if len(logged) else float("nan"),
                    "verdict": f"{'distinguishable' if real else 'not distinguishable'} from zero"
                    f" over the {windows} windows of seed {seed}",
                }
            )
            groups.setdefault((shape, comparison, split), []).append((a - b, float(a.mean()), real))
    for (shape, comparison, split), seeds in groups.items():
        fields, summary = stats.seed_row(
            [d.mean() for d, _, _ in seeds],
            [d for d, _, _ in seeds],
            [m for _, m, _ in seeds],
            confidence,
            power,
            {"band": cfg["band"], "target": cfg["target"]},
            BOOTSTRAP_RESAMPLES,
            alpha=alpha,
        )
        text = stats.seed_verdict(
            summary, [r for *_, r in seeds], fields["baseline_sd"], _nats, f"{comparison} lower", f"{comparison} higher"
        )
        rows.append(
            {
                "shape": shape,
                "comparison": comparison,
                "seed": layout.ALL_SEEDS,
                "split": split,
                "final_difference": summary["mean"],
                "windows": windows,
                "baseline_loss": float(np.mean([m for _, m, _ in seeds])),
                **fields,
                "verdict": text,
            }
        )
    over = [r for r in rows if r["seed"] == layout.ALL_SEEDS]
    families: dict[tuple, list[dict]] = {}
    for r in over:
        families.setdefault((r["comparison"], r["split"]), []).append(r)
    for (comparison, split), members in families.items():
        family = f"final {split} loss of {comparison}, per shape ({len(members)} tests)"
        for r, adjusted in zip(members, stats.holm([r["p_seeds"] for r in members])):
            r.update(family=family, p_holm=adjusted)
            n, sd = r["seeds"], r["sd"]
            se = sd / math.sqrt(n) if n > 1 else math.nan
            different = bool(n > 1 and (r["ci_low"] > 0 or r["ci_high"] < 0) and adjusted <= alpha)
            r["tost_p_band"] = stats.tost_p(r["final_difference"], se, n - 1, cfg["band"])
            r["equivalence"] = stats.equivalence_verdict(
                different, r["tost_p_band"], cfg["band"], alpha, lambda x: f"{x:g} nats"
            )
            if r["verdict"].startswith("consistent") and not adjusted <= alpha:
                r["verdict"] += f"; but p = {r['p_seeds']:.2g} over seeds is {adjusted:.2g} after Holm over the family"
    columns = [
        "shape",
        "comparison",
        "seed",
        "split",
        "final_difference",
        "ci_low",
        "ci_high",
        "boot_low",
        "boot_high",
        "seeds",
        "sd",
        "baseline_sd",
        "windows",
        "baseline_loss",
        "compared_loss",
        "logged_difference",
        "p_seeds",
        "family",
        "p_holm",
        "within_se",
        "sd_low",
        "sd_high",
        "mde",
        "mde_low",
        "mde_high",
        "band",
        "seeds_for_band",
        "seeds_for_band_low",
        "seeds_for_band_high",
        "target",
        "seeds_for_target",
        "seeds_for_target_low",
        "seeds_for_target_high",
        "tost_p_band",
        "equivalence",
        "verdict",
    ]
    return pd.DataFrame(rows, columns=columns)


PRIMARY_COMPARISON, PRIMARY_SPLIT = "streamback", "val"  # the primary test, declared before any run
PRIMARY_COLUMNS = [
    "comparison",
    "split",
    "quantity",
    "shapes",
    "strata",
    "seeds",
    "estimate",
    "se",
    "df",
    "low",
    "high",
    "p",
    "p_floor",
    "different",
    "sd",
    "sd_low",
    "sd_high",
    "mde",
    "mde_low",
    "mde_high",
    "band",
    "seeds_for_band",
    "seeds_for_band_low",
    "seeds_for_band_high",
    "tost_p_band",
    "verdict_band",
    "tost_p_mde",
    "verdict_mde",
]


def primary_table(finals: pd.DataFrame, cfg: dict) -> pd.DataFrame:
    """results/tables/primary.csv: the tier's one primary test (`stats.primary_test`), declared
    before the run: the final validation loss, baseline minus StreamBack, pooled over the tier's
    shapes with shapes as strata and seeds as units (a row of loss_difference.csv per seed), at
    analysis.confidence and analysis.power, with the equivalence tests against the paper's band
    (analysis.band) and against the smallest band the tier resolves (its MDE). One row; none where
    the study compares no StreamBack run."""
    rows = finals[
        (finals.seed.astype(str) != layout.ALL_SEEDS)
        & (finals.comparison == PRIMARY_COMPARISON)
        & (finals.split == PRIMARY_SPLIT)
    ]
    if rows.empty:
        return pd.DataFrame(columns=PRIMARY_COLUMNS)
    strata = {shape: group.final_difference.to_numpy(dtype=float) for shape, group in rows.groupby("shape", sort=False)}
    test = stats.primary_test(strata, cfg["confidence"], cfg["power"], cfg["band"], lambda x: f"{x:.4g} nats")
    quantity = "final validation loss, baseline minus StreamBack (nats)"
    return pd.DataFrame(
        [{"comparison": PRIMARY_COMPARISON, "split": PRIMARY_SPLIT, "quantity": quantity, **test}],
        columns=PRIMARY_COLUMNS,
    )


def across_seeds_curves(curves: pd.DataFrame) -> pd.DataFrame:
    """Per shape, comparison and split, at every step all its seeds logged: the mean over seeds of the
    raw and smoothed differences, and the range of the smoothed one (band_low, band_high); seed `all`."""
    keys = ["shape", "comparison", "split", "step", "tokens"]
    seeds = curves.groupby(["shape", "comparison", "split"]).seed.transform("nunique")
    grouped = curves.assign(seeds=seeds).groupby(keys, sort=False)
    out = grouped.agg(
        difference=("difference", "mean"),
        smoothed=("smoothed", "mean"),
        band_low=("smoothed", "min"),
        band_high=("smoothed", "max"),
        logged=("seed", "nunique"),
        seeds=("seeds", "first"),
    ).reset_index()
    return out[out.logged == out.seeds].drop(columns=["logged", "seeds"]).assign(seed=layout.ALL_SEEDS)


ACCUMULATION_COLUMNS = [
    "shape",
    "comparison",
    "seed",
    "seeds",
    "half_steps",
    "slope",
    "low",
    "high",
    "p",
    "change",
    "verdict",
]


def accumulation_rows(pairs, matrix, records: dict, window: int, confidence: float) -> pd.DataFrame:
    """The accumulation test of `pairs` ((shape, baseline, other) runs) from the runs' metrics
    `records`: a row per seed (its slope) and one over the seeds of each shape and comparison (seed
    `all`; see the module docstring); `window`: analysis.smooth_steps."""
    groups = {}
    for shape, baseline, other in pairs:
        a = {r["step"]: r["loss"] for r in records[baseline] if "loss" in r}
        b = {r["step"]: r["loss"] for r in records[other] if "loss" in r}
        groups.setdefault((shape, comparison_name(matrix[other])), {})[matrix[other].seed] = stats.paired_by_step(a, b)
    rows = []
    for (shape, comparison), series in groups.items():
        try:
            out = stats.accumulation(series, window, confidence)
        except StreambackError:  # runs too short for a second half of two steps: nothing to read
            out = {"slopes": {}, "n": 0, "half_steps": math.nan, "mean": math.nan, "low": math.nan}
            out |= {"high": math.nan, "p": math.nan, "change": math.nan, "verdict": stats.ACCUMULATION_WORDS[2]}
        for seed, slope in out["slopes"].items():
            rows.append({"shape": shape, "comparison": comparison, "seed": seed, "seeds": 1, "slope": slope})
        rows.append(
            {
                "shape": shape,
                "comparison": comparison,
                "seed": layout.ALL_SEEDS,
                "seeds": out["n"],
                "half_steps": out["half_steps"],
                "slope": out["mean"],
                "low": out["low"],
                "high": out["high"],
                "p": out["p"],
                "change": out["change"],
                "verdict": out["verdict"],
            }
        )
    return pd.DataFrame(rows, columns=ACCUMULATION_COLUMNS)
