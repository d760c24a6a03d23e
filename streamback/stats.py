"""The study's statistics, in one place: is a difference between two runs real?

Within one training seed, paired on the same items or windows (a: the baseline, b: the other run):
- `paired_difference`: mean(a - b) over paired values (e.g. per-window losses) with a paired t
  interval, `t_interval` of the differences;
- `paired_bootstrap_ci`: the difference of the means, mean(b) - mean(a), with a percentile
  confidence interval from resampling items with replacement;
- `bootstrap_ratio_ci`: a ratio of sums over items, sum(a) / sum(b), with the same percentile
  interval (e.g. the sign flips of two stream formats over validation sequences);
- `mcnemar_exact`: the exact McNemar test: of the discordant items (right in one run only),
  under no difference each is equally likely to favour either run, so the count favouring one is
  Binomial(discordant, 1/2); two-sided p = 2 x the smaller tail, at most 1;
- `holm`: Holm's step-down adjustment of a family of p-values;
- `min_detectable_difference`: the smallest true difference the exact McNemar test at level
  alpha detects with the given power over n items, when the runs disagree on a fraction p_d of
  the items (the observed fraction, or the difference itself if that is larger: a difference of
  delta needs at least delta of the items discordant). Power is exact: the number of discordant
  items is Binomial(n, p_d), and given m of them the count favouring the better run is
  Binomial(m, (1 + delta / p_d) / 2).
Across training seeds (each seed trains both runs from the same weights on the same batches, so
each seed gives one paired difference):
- `across_seeds`: the mean of the per-seed differences with a t interval over seeds (n_seeds - 1
  degrees of freedom), their sd and the exact sign-flip p (`sign_flip_p`), which n seeds can never
  push below 2 / 2^n, however alike their differences;
- `hierarchical_bootstrap`: the same mean with a percentile interval from resampling seeds, then
  items (or windows) within each drawn seed, so both sources of noise are in it;
- `seed_verdict`: the difference against the seed-to-seed spread, in words: "consistent across
  seeds" needs the t interval and the bootstrap to exclude zero, and a spread over seeds;
- `seed_mde`, `seeds_needed`: the smallest difference n seeds detect at a given power, and the
  seeds a target difference needs, from the spread of the per-seed differences.
Every interval over seeds takes one value a seed (`per_seed`: a seed's paired difference, or the
mean of its runs, which share the seed's weights and batches). Over strata (shapes):
- `contrast`: a fixed contrast of independent groups' means with Welch's t interval and p;
- `stratified_mean`: the mean over shapes of their seeds' means, its interval, pooled sd with its
  chi-square interval (`sd_interval`) and MDE with the range that interval gives;
- `primary_test`: the tier's one primary test (the final validation loss pooled over shapes, the
  shapes as strata, the seeds as units): `stratified_mean`, the exact sign-flip p over every seed,
  and two one-sided tests of equivalence (`tost_p`) within the paper's band and within the MDE,
  each read in words by `equivalence_verdict` ("equivalent within ±X", "different", "different,
  but within ±X", "inconclusive").
Across depths (`depth_trend`): the slope of a measure against log2(depth) (its change per doubling
of depth), from the per-seed values at each depth, with a Welch t interval, p and a bootstrap
within depths, every adjacent contrast beside it, and a verdict in words (`trend_verdict`, which
also takes the slope's Holm-adjusted p over its family).
Per task, over models (`task_snr`): signal-and-noise's signal-to-noise ratio, the decision
accuracy it implies and whether the task can rank the models at all.
Binomial probabilities are computed in log space from log-factorials (numpy only); t quantiles
come from scipy. The tests check every function against scipy, statsmodels, simulation or hand
computation.
"""

from __future__ import annotations

import functools
import itertools
import math
from collections.abc import Sequence

import numpy as np

from streamback.errors import StreambackError


def paired_bootstrap_ci(
    a: Sequence[float], b: Sequence[float], confidence: float = 0.95, resamples: int = 10000, seed: int = 0
) -> tuple[float, float, float]:
    """(mean(b) - mean(a), lower, upper): the percentile interval of the mean difference over
    `resamples` resamples of the items (both runs' outcomes of an item drawn together)."""
    diff = np.asarray(b, dtype=np.float64) - np.asarray(a, dtype=np.float64)
    n = diff.size
    if n == 0 or np.asarray(a).shape != np.asarray(b).shape:
        raise ValueError(
            f"paired_bootstrap_ci needs two equally long, non-empty samples, got {np.asarray(a).shape} and "
            f"{np.asarray(b).shape}"
        )
    rng = np.random.default_rng(seed)
    means = np.empty(resamples)
    chunk = max(1, 4_000_000 // n)  # resamples per draw of indices (about 32 MB of int64)
    for start in range(0, resamples, chunk):
        stop = min(start + chunk, resamples)
        means[start:stop] = diff[rng.integers(0, n, size=(stop - start, n))].mean(axis=1)
    tail = (1 - confidence) / 2
    lower, upper = np.quantile(means, [tail, 1 - tail])
    return float(diff.mean()), float(lower), float(upper)


def bootstrap_ratio_ci(
    a: Sequence[float], b: Sequence[float], confidence: float = 0.95, resamples: int = 10000, seed: int = 0
) -> tuple[float, float, float]:
    """(sum(a) / sum(b), lower, upper): the percentile interval of the ratio of sums over `resamples`
    resamples of the items (an item's a and b drawn together). The ratio is NaN where sum(b) is
    zero; resamples whose b sums to zero are left out of the interval (NaN if all are)."""
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    n = a.size
    if n == 0 or a.shape != b.shape:
        raise ValueError(f"bootstrap_ratio_ci needs two equally long, non-empty samples, got {a.shape} and {b.shape}")
    rng = np.random.default_rng(seed)
    ratios = np.empty(resamples)
    chunk = max(1, 4_000_000 // n)
    with np.errstate(divide="ignore", invalid="ignore"):
        for start in range(0, resamples, chunk):
            stop = min(start + chunk, resamples)
            drawn = rng.integers(0, n, size=(stop - start, n))
            ratios[start:stop] = a[drawn].sum(axis=1) / b[drawn].sum(axis=1)
        ratio = a.sum() / b.sum() if b.sum() else math.nan
    ratios[~np.isfinite(ratios)] = np.nan
    if np.isnan(ratios).all():
        return float(ratio), math.nan, math.nan
    tail = (1 - confidence) / 2
    lower, upper = np.nanquantile(ratios, [tail, 1 - tail])
    return float(ratio), float(lower), float(upper)


def discordant(a: Sequence[int], b: Sequence[int]) -> tuple[int, int]:
    """(items right in a only, items right in b only) of two 0/1 outcome lists."""
    a, b = np.asarray(a, dtype=bool), np.asarray(b, dtype=bool)
    return int((a & ~b).sum()), int((~a & b).sum())


def _log_factorials(n: int) -> np.ndarray:
    return np.concatenate([[0.0], np.cumsum(np.log(np.arange(1, n + 1, dtype=np.float64)))])


def _binom_pmf(m: int, p: float, logfact: np.ndarray) -> np.ndarray:
    """Binomial(m, p) probabilities of 0..m."""
    k = np.arange(m + 1)
    if p <= 0.0 or p >= 1.0:
        out = np.zeros(m + 1)
        out[0 if p <= 0.0 else m] = 1.0
        return out
    return np.exp(logfact[m] - logfact[k] - logfact[m - k] + k * math.log(p) + (m - k) * math.log1p(-p))


def mcnemar_exact(only_a: int, only_b: int) -> float:
    """Two-sided exact McNemar p-value from the discordant counts (1 when there are none)."""
    m = only_a + only_b
    if m == 0:
        return 1.0
    tail = _binom_pmf(m, 0.5, _log_factorials(m))[: min(only_a, only_b) + 1].sum()
    return float(min(1.0, 2.0 * tail))


def holm(pvalues: Sequence[float]) -> list[float]:
    """Holm's step-down adjusted p-values, in the given order (NaNs kept, not counted)."""
    p = np.asarray(pvalues, dtype=np.float64)
    out = np.full(p.shape, np.nan)
    tested = np.flatnonzero(~np.isnan(p))
    order = tested[np.argsort(p[tested], kind="stable")]
    m, running = len(order), 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (m - rank) * p[i]))
        out[i] = running
    return out.tolist()


@functools.lru_cache(maxsize=None)
def _critical_count(m: int, alpha: float) -> int:
    """The largest k whose two-sided exact McNemar p-value 2 P(Binomial(m, 1/2) <= k) is at most
    alpha, for m discordant items (-1: no outcome rejects)."""
    cdf = np.cumsum(_binom_pmf(m, 0.5, _log_factorials(m)))
    return int(np.searchsorted(2.0 * cdf, alpha, side="right")) - 1


def mcnemar_power(n: int, p_discordant: float, delta: float, alpha: float = 0.05) -> float:
    """Probability that the two-sided exact McNemar test at level `alpha` rejects, over n items
    when the runs disagree on a fraction `p_discordant` and their accuracies differ by `delta`
    (0 <= delta <= p_discordant)."""
    if not 0 <= delta <= p_discordant <= 1:
        raise ValueError(f"need 0 <= delta <= p_discordant <= 1, got delta={delta}, p_discordant={p_discordant}")
    if p_discordant == 0:
        return 0.0
    logfact = _log_factorials(n)
    weights = _binom_pmf(n, p_discordant, logfact)
    spread = 12 * math.sqrt(n * p_discordant * (1 - p_discordant)) + 12  # the mass beyond is below 1e-30
    m_values = np.arange(max(0, int(n * p_discordant - spread)), min(n, int(n * p_discordant + spread)) + 1)
    favour = min(1.0, (1 + delta / p_discordant) / 2)
    power = 0.0
    for m in m_values:
        k = _critical_count(int(m), alpha)
        if k < 0:
            continue
        pmf = _binom_pmf(int(m), favour, logfact)
        power += weights[m] * (pmf[: k + 1].sum() + pmf[int(m) - k :].sum())
    return float(power)


def min_detectable_difference(
    n: int, p_discordant: float, alpha: float = 0.05, power: float = 0.8, tol: float = 1e-4
) -> float:
    """The smallest accuracy difference delta that the exact McNemar test at level `alpha` detects
    with probability `power` over n items, the runs disagreeing on a fraction max(p_discordant,
    delta) of them; NaN if no difference can be (too few items). Bisection to `tol`."""

    def enough(delta: float) -> bool:
        return mcnemar_power(n, max(p_discordant, delta), delta, alpha) >= power

    if n < 1 or not enough(1.0):
        return float("nan")
    low, high = 0.0, 1.0
    while high - low > tol:
        mid = (low + high) / 2
        low, high = (low, mid) if enough(mid) else (mid, high)
    return high


def t_interval(values: Sequence[float], confidence: float) -> tuple[float, float, float]:
    """(mean, lower, upper): the two-sided t interval mean +- t(confidence, n - 1) sd / sqrt(n)
    of `values` (n >= 2; NaN bounds for n = 1, whose spread is unknown)."""
    x = np.asarray(values, dtype=np.float64)
    if x.ndim != 1 or x.size == 0:
        raise ValueError(f"a t interval needs a non-empty 1-D sample, got shape {x.shape}")
    mean = float(x.mean())
    if x.size < 2:
        return mean, math.nan, math.nan
    from scipy import stats as sps  # imported here: a second of import time most callers need not pay

    half = float(sps.t.ppf(0.5 + confidence / 2, x.size - 1) * x.std(ddof=1) / math.sqrt(x.size))
    return mean, mean - half, mean + half


def paired_difference(a: Sequence[float], b: Sequence[float], confidence: float) -> tuple[float, float, float]:
    """mean(a - b) over paired values (e.g. two runs' losses on the same windows) and its paired t
    interval; at least 2 pairs."""
    d = np.asarray(a, dtype=np.float64) - np.asarray(b, dtype=np.float64)
    if d.ndim != 1 or len(d) < 2:
        raise StreambackError(f"a paired confidence interval needs at least 2 paired windows, got {d.size}")
    return t_interval(d, confidence)


def sign_flip_p(differences: Sequence[float], draws: int = 200_000, seed: int = 0) -> float:
    """The exact two-sided sign-flip p of mean 0 for per-seed paired differences: the share of the
    2^n ways of flipping their signs whose |sum| is at least the observed one (ties within 1e-12
    relative count). It assumes only that, with no effect, each seed's difference is as likely
    negative as positive (the two runs of a seed are exchangeable: same weights, same batches), and
    that seeds are independent; no normality, no estimate of the spread. The observed signs and
    their mirror are always among the 2^n, so p >= 2 / 2^n (0.25 with three seeds): identical
    differences never give p = 0. Past 20 seeds, `draws` random sign patterns (p = (1 + hits) /
    (1 + draws)). NaN for no seed; 1 when every difference is 0."""
    d = np.asarray(differences, dtype=np.float64)
    if d.ndim != 1:
        raise ValueError(f"sign_flip_p needs a 1-D sample, got shape {d.shape}")
    if d.size == 0:
        return math.nan
    observed = abs(d.sum())
    tolerance = 1e-12 * max(np.abs(d).sum(), 1e-300)
    if d.size <= 20:
        patterns = 1 - 2 * ((np.arange(2**d.size)[:, None] >> np.arange(d.size)) & 1)
        return float(np.mean(np.abs(patterns @ d) >= observed - tolerance))
    signs = np.random.default_rng(seed).choice([-1.0, 1.0], size=(draws, d.size))
    return float((1 + np.sum(np.abs(signs @ d) >= observed - tolerance)) / (1 + draws))


def across_seeds(differences: Sequence[float], confidence: float) -> dict:
    """The per-seed paired differences summarised over seeds: n, mean, sd (ddof 1), the t interval
    (low, high), the exact sign-flip p of mean 0 (`sign_flip_p`; NaN where n < 2) and the smallest
    p n seeds can give (`p_floor`, 2 / 2^n)."""
    d = np.asarray(differences, dtype=np.float64)
    mean, low, high = t_interval(d, confidence)
    sd = float(d.std(ddof=1)) if d.size > 1 else math.nan
    p = sign_flip_p(d) if d.size > 1 else math.nan
    return {
        "n": int(d.size),
        "mean": mean,
        "sd": sd,
        "low": low,
        "high": high,
        "p": p,
        "p_floor": min(1.0, 2.0 / 2**d.size),
        "min": float(d.min()),
        "max": float(d.max()),
    }


def hierarchical_bootstrap(
    groups: Sequence[Sequence[float]], confidence: float = 0.95, resamples: int = 10000, seed: int = 0
) -> tuple[float, float, float]:
    """(estimate, lower, upper) of the mean over seeds of each seed's mean paired difference:
    `groups` holds one array per seed (its per-item or per-window differences). Each resample
    draws as many seeds as there are, with replacement, then each drawn seed's items with
    replacement, and averages the drawn seeds' item means; the interval is the resamples'
    percentiles (with one seed, it is that seed's item bootstrap)."""
    arrays = [np.asarray(g, dtype=np.float64) for g in groups]
    if not arrays or any(a.ndim != 1 or a.size == 0 for a in arrays):
        raise ValueError("hierarchical_bootstrap needs at least one seed, each with a non-empty 1-D sample")
    rng = np.random.default_rng(seed)
    k = len(arrays)
    picks = rng.integers(0, k, size=(resamples, k))
    seed_means = np.empty((resamples, k))
    for s, a in enumerate(arrays):
        drawn = picks == s  # the resamples and positions that drew seed s, each gets its own item resample
        count = int(drawn.sum())
        means = np.empty(count)
        chunk = max(1, 4_000_000 // a.size)
        for start in range(0, count, chunk):
            stop = min(start + chunk, count)
            means[start:stop] = a[rng.integers(0, a.size, size=(stop - start, a.size))].mean(axis=1)
        seed_means[drawn] = means
    tail = (1 - confidence) / 2
    lower, upper = np.quantile(seed_means.mean(axis=1), [tail, 1 - tail])
    return float(np.mean([a.mean() for a in arrays])), float(lower), float(upper)


def seed_mde(sd: float, n: int, alpha: float = 0.05, power: float = 0.8, within_se: float = 0.0) -> float:
    """The minimum detectable effect over n seeds: the smallest true mean difference that the
    two-sided t-test of the seeds' paired differences at level `alpha` (the t interval excluding 0)
    finds with probability `power`, from the noncentral t (n - 1 degrees of freedom, noncentrality
    delta sqrt(n) / sigma). sigma is the per-seed differences' sd, but never below `within_se`,
    the item or window noise of one seed's difference (sd of the items' differences / sqrt(items)),
    which each seed's difference carries whatever the seeds show. Past 2,001 seeds the normal
    approximation. Same unit as `sd`; NaN for n < 2 or no spread at all."""
    sigma = max(sd, within_se) if not math.isnan(sd) else math.nan
    if n < 2 or not sigma > 0:
        return math.nan
    from scipy import optimize  # imported here: a second of import time most callers need not pay
    from scipy import stats as sps

    df = n - 1
    # past 2,000 seeds the t is a normal to 4 digits (and scipy's noncentral t turns NaN)
    law, critical = (sps.norm, sps.norm.ppf(1 - alpha / 2)) if df > 2000 else (sps.nct, sps.t.ppf(1 - alpha / 2, df))

    def short(delta: float) -> float:
        nc = delta * math.sqrt(n) / sigma
        if law is sps.norm:
            return law.sf(critical - nc) + law.cdf(-critical - nc) - power
        lower = law.cdf(-critical, df, nc)  # the wrong-side tail; NaN in scipy where it is below 1e-180
        return law.sf(critical, df, nc) + (0.0 if math.isnan(lower) else lower) - power

    high = sigma
    while short(high) < 0:
        high *= 2
    return float(optimize.brentq(short, 0.0, high, xtol=1e-12 * sigma, rtol=1e-10))


def seeds_needed(sigma: float, target: float, alpha: float = 0.05, power: float = 0.8, most: int = 100_000) -> float:
    """The fewest seeds (at least 2) whose `seed_mde` at spread `sigma` is at most `target`; NaN if
    sigma is unknown or more than `most` seeds would be needed."""
    if not (sigma > 0 and target > 0):
        return math.nan
    if seed_mde(sigma, most, alpha, power) > target:
        return math.nan
    low, high = 1, most  # seed_mde(high) <= target; low is too few (or below 2)
    while high - low > 1:
        mid = (low + high) // 2
        low, high = (low, mid) if mid >= 2 and seed_mde(sigma, mid, alpha, power) <= target else (mid, high)
    return float(high)


def within_se(groups: Sequence[Sequence[float]]) -> float:
    """The item (or window) noise of one seed's mean difference: the root mean over seeds of
    var(items, ddof 1) / items; 0 where every seed has a single item."""
    arrays = [np.asarray(g, dtype=np.float64) for g in groups]
    return float(math.sqrt(np.mean([a.var(ddof=1) / a.size if a.size > 1 else 0.0 for a in arrays])))


def seed_row(
    differences: Sequence[float],
    items: Sequence[Sequence[float]],
    baseline_values: Sequence[float],
    confidence: float,
    power: float,
    targets: dict[str, float],
    resamples: int = 10000,
    seed: int = 0,
    alpha: float | None = None,
) -> tuple[dict, dict]:
    """The fields of a comparison's row over its training seeds, the one builder of the loss and
    task-score tables: from each seed's difference, each seed's per-item (or per-window)
    differences and each seed's baseline value. Returns (fields, summary): fields ci_low, ci_high
    (t over seeds), boot_low, boot_high (`hierarchical_bootstrap` over seeds then items), seeds,
    sd, sd_low, sd_high (the sd's chi-square interval at `confidence`, `sd_interval`), baseline_sd,
    p_seeds (sign flip over seeds), within_se, mde with mde_low, mde_high (the MDE at the sd's
    interval's ends: the MDE is proportional to the spread) and, per name of `targets`, the target,
    `seeds_for_<name>` and its range `seeds_for_<name>_low` (at the interval's low sd: the fewest)
    and `_high`; summary is `across_seeds`'s with the bootstrap interval (for `seed_verdict`).
    `alpha`: the test's level (default 1 - confidence)."""
    alpha = 1 - confidence if alpha is None else alpha
    summary = across_seeds(differences, confidence)
    _, summary["boot_low"], summary["boot_high"] = hierarchical_bootstrap(items, confidence, resamples, seed)
    noise = within_se(items)
    sigma = max(summary["sd"], noise)
    sd_low, sd_high = sd_interval(summary["sd"], summary["n"] - 1, confidence)
    fields = {
        "ci_low": summary["low"],
        "ci_high": summary["high"],
        "boot_low": summary["boot_low"],
        "boot_high": summary["boot_high"],
        "seeds": summary["n"],
        "sd": summary["sd"],
        "sd_low": sd_low,
        "sd_high": sd_high,
        "baseline_sd": across_seeds(baseline_values, confidence)["sd"],
        "p_seeds": summary["p"],
        "within_se": noise,
        "mde": seed_mde(summary["sd"], summary["n"], alpha, power, noise),
        "mde_low": seed_mde(sd_low, summary["n"], alpha, power, noise),
        "mde_high": seed_mde(sd_high, summary["n"], alpha, power, noise),
    }
    for name, target in targets.items():
        fields[name] = target
        fields[f"seeds_for_{name}"] = seeds_needed(sigma, target, alpha, power)
        for end, spread in (("low", sd_low), ("high", sd_high)):
            fields[f"seeds_for_{name}_{end}"] = (
                seeds_needed(max(spread, noise), target, alpha, power) if math.isfinite(spread) else math.nan
            )
    return fields, summary


def seed_verdict(
    summary: dict, per_seed_significant: Sequence[bool], noise_sd: float, fmt, better: str, worse: str
) -> str:
    """The across-seeds verdict in words. `summary`: `across_seeds` of the per-seed differences
    (positive: the other run is better), with `boot_low`/`boot_high` from `hierarchical_bootstrap`;
    `per_seed_significant`: whether each seed's own test found a difference; `noise_sd`: the
    seed-to-seed sd of the baseline's own score (the noise floor); `fmt` formats a difference;
    `better`/`worse`: how to say the other run's direction.

    "Consistent across seeds" needs both the t interval over seeds (seed noise, assuming the
    seeds' differences are roughly normal) and the bootstrap over seeds then items (seed and item
    noise, no normality, but narrow with few seeds) to exclude zero on the same side, and the
    seeds to differ at all: identical differences (sd 0) leave the t interval zero wide, so they
    never count as consistent. The exact sign-flip p is quoted with its floor 2 / 2^n."""
    n, mean = summary["n"], summary["mean"]
    if n < 2:
        return (
            "one training seed: training randomness is not covered (train more seeds, train.runs.seeds, to know "
            "whether "
            "this difference survives a different initialisation and data order)"
        )
    spread = f"per-seed differences {fmt(summary['min'])} to {fmt(summary['max'])}, sd {fmt(summary['sd'], sign=False)}"
    floor = (
        ""
        if math.isnan(noise_sd)
        else f"; the baseline's own score varies by sd {fmt(noise_sd, sign=False)} from seed to seed"
    )
    interval = (
        f"{fmt(summary['low'])} to {fmt(summary['high'])} over {n} seeds (t), {fmt(summary['boot_low'])} to "
        f"{fmt(summary['boot_high'])} (seeds, then items)"
    )
    p = f"exact sign-flip p = {summary['p']:.2g}, the smallest {n} seeds can give being {summary['p_floor']:.2g}"
    t_side = 1 if summary["low"] > 0 else -1 if summary["high"] < 0 else 0
    boot_side = 1 if summary["boot_low"] > 0 else -1 if summary["boot_high"] < 0 else 0
    if summary["sd"] > 0 and t_side != 0 and t_side == boot_side:
        return (
            f"consistent across seeds: {better if mean > 0 else worse} by {fmt(abs(mean), sign=False)} ({interval}; "
            f"{p}; {spread}{floor})"
        )
    flips = sum(per_seed_significant) and (summary["min"] < 0 < summary["max"])
    if flips:
        why = "significant within some seeds, but of opposite signs"
    elif not summary["sd"] > 0:
        why = f"the {n} seeds' differences are identical, so their spread is unknown and the t interval has no width"
    elif t_side == 0:
        why = "the interval over seeds includes 0"
    else:
        why = "the bootstrap over seeds then items includes 0"
    return f"within seed noise: {fmt(mean)} on average, {why} ({interval}; {p}; {spread}{floor})"


def per_seed(values: Sequence[float], seeds: Sequence) -> np.ndarray:
    """One value per training seed: the mean of each seed's `values` (in the order the seeds first
    appear), NaNs left out of a seed's mean (a seed with none is left out). The runs of one seed
    share their initial weights and batches, so they are not independent: an interval or a
    bootstrap over seeds takes this, never the runs themselves."""
    x = np.asarray(values, dtype=np.float64)
    keys = list(seeds)
    if x.ndim != 1 or x.size != len(keys):
        raise ValueError(f"per_seed needs one seed per value, got {x.size} values and {len(keys)} seeds")
    out = []
    for key in dict.fromkeys(keys):
        mine = x[[k == key for k in keys]]
        mine = mine[np.isfinite(mine)]
        if mine.size:
            out.append(float(mine.mean()))
    return np.asarray(out, dtype=np.float64)


def contrast(groups: Sequence[Sequence[float]], weights: Sequence[float], confidence: float = 0.95) -> dict:
    """A fixed contrast c = sum_g w_g m_g of independent groups' means (`groups`: each group's units,
    e.g. a depth's or a shape's per-seed values) with its Welch t interval: var c = sum_g w_g^2
    s_g^2 / n_g, degrees of freedom Welch and Satterthwaite's, (sum_g w_g^2 s_g^2 / n_g)^2 / sum_g
    (w_g^2 s_g^2 / n_g)^2 / (n_g - 1) (groups of weight 0 left out), and the two-sided t p of c = 0.
    Returns estimate, se, df, low, high, p; NaN bounds where a weighted group has a single unit; an
    interval of no width (and p NaN) where the units do not vary at all."""
    arrays = [np.asarray(g, dtype=np.float64) for g in groups]
    w = np.asarray(weights, dtype=np.float64)
    if len(arrays) != w.size or any(a.ndim != 1 or a.size == 0 for a in arrays):
        raise ValueError(f"a contrast needs one non-empty 1-D sample per weight, got {len(arrays)} for {w.size}")
    estimate = float(sum(wg * a.mean() for wg, a in zip(w, arrays)))
    out = {"estimate": estimate, "se": math.nan, "df": math.nan, "low": math.nan, "high": math.nan, "p": math.nan}
    used = [(wg, a) for wg, a in zip(w, arrays) if wg != 0]
    if not used or any(a.size < 2 for _, a in used):
        return out
    from scipy import stats as sps  # imported here: a second of import time most callers need not pay

    parts = np.array([wg**2 * a.var(ddof=1) / a.size for wg, a in used])
    variance = float(parts.sum())
    out["se"] = math.sqrt(variance)
    if variance == 0:
        return {**out, "low": estimate, "high": estimate}
    df = variance**2 / float(np.sum(parts**2 / np.array([a.size - 1 for _, a in used])))
    half = float(sps.t.ppf(0.5 + confidence / 2, df)) * out["se"]
    p = float(2 * sps.t.sf(abs(estimate) / out["se"], df))
    return {**out, "df": df, "low": estimate - half, "high": estimate + half, "p": p}


def sd_interval(sd: float, df: float, confidence: float = 0.95) -> tuple[float, float]:
    """The chi-square interval of a normal sample's sd estimated with `df` degrees of freedom (n - 1
    for n values): sd sqrt(df / chi2(1 - a/2, df)) to sd sqrt(df / chi2(a/2, df)), a = 1 -
    confidence (with 3 values, about 0.52 to 6.3 times sd). NaN for df <= 0 or an unknown sd."""
    if not (df > 0) or not math.isfinite(sd):
        return math.nan, math.nan
    from scipy import stats as sps  # imported here: a second of import time most callers need not pay

    tail = (1 - confidence) / 2
    return (
        float(sd * math.sqrt(df / sps.chi2.ppf(1 - tail, df))),
        float(sd * math.sqrt(df / sps.chi2.ppf(tail, df))),
    )


def tost_p(estimate: float, se: float, df: float, band: float) -> float:
    """Two one-sided t tests of equivalence within ±`band`: the larger of the p of H0 "difference <=
    -band" (t = (estimate + band) / se) and of H0 "difference >= +band" (t = (estimate - band) / se),
    each one-sided with `df` degrees of freedom. p <= alpha: equivalent within ±band at level alpha
    (the 1 - 2 alpha t interval lies inside the band). NaN where the spread is unknown."""
    if not (se > 0 and df > 0 and band > 0) or not math.isfinite(estimate):
        return math.nan
    from scipy import stats as sps  # imported here: a second of import time most callers need not pay

    return float(max(sps.t.sf((estimate + band) / se, df), sps.t.cdf((estimate - band) / se, df)))


EQUIVALENCE_WORDS = ("equivalent within", "different", "inconclusive", "different, but within")


def equivalence_verdict(different: bool, p_tost: float, band: float, alpha: float, fmt=lambda x: f"{x:g}") -> str:
    """The verdict of a difference test and an equivalence test together, in words that cannot be
    misread: "equivalent within ±X" (TOST p <= alpha, no difference shown), "different" (a
    difference, not within ±X), "different, but within ±X" (both: a real difference smaller than
    X), "inconclusive" (neither: the data cannot tell). `fmt` writes the band."""
    within = math.isfinite(p_tost) and p_tost <= alpha
    if different and within:
        return f"{EQUIVALENCE_WORDS[3]} ±{fmt(band)}"
    if different:
        return EQUIVALENCE_WORDS[1]
    if within:
        return f"{EQUIVALENCE_WORDS[0]} ±{fmt(band)}"
    return EQUIVALENCE_WORDS[2]


def stratified_mean(strata: dict[str, Sequence[float]], confidence: float = 0.95, power: float = 0.8) -> dict:
    """The mean over strata (shapes) of their units' means, each stratum weighing the same, its
    units one value a training seed: the Welch t interval of that contrast (`contrast`), the pooled
    sd of a unit (sqrt(n) se over n units) with its chi-square interval (`sd_interval`, at the
    contrast's degrees of freedom) and the minimum detectable effect at `power` and level 1 -
    confidence (`seed_mde` over n units) with its range at that interval's ends. Returns strata,
    shapes (their names), seeds (n), estimate, se, df, low, high, sd, sd_low, sd_high, mde, mde_low,
    mde_high."""
    names = [s for s, v in strata.items() if len(v)]
    arrays = [np.asarray(strata[s], dtype=np.float64) for s in names]
    if not arrays:
        raise ValueError("a stratified mean needs at least one stratum with a seed")
    alpha = 1 - confidence
    k = len(arrays)
    c = contrast(arrays, [1 / k] * k, confidence)
    n = int(sum(a.size for a in arrays))
    sd = c["se"] * math.sqrt(n) if math.isfinite(c["se"]) else math.nan
    sd_low, sd_high = sd_interval(sd, c["df"], confidence)
    mde = [seed_mde(s, n, alpha, power) if math.isfinite(s) else math.nan for s in (sd, sd_low, sd_high)]
    return {
        "strata": k,
        "shapes": ", ".join(names),
        "seeds": n,
        **{key: c[key] for key in ("estimate", "se", "df", "low", "high")},
        "sd": sd,
        "sd_low": sd_low,
        "sd_high": sd_high,
        "mde": mde[0],
        "mde_low": mde[1],
        "mde_high": mde[2],
    }


def primary_test(
    strata: dict[str, Sequence[float]], confidence: float, power: float, band: float, fmt=lambda x: f"{x:g}"
) -> dict:
    """The tier's one primary test: each stratum (a shape) holds its seeds' paired differences (one
    a seed); the estimate is the mean over strata of their means with its t interval, pooled sd and
    minimum detectable effect with their ranges (`stratified_mean`), the exact sign-flip p over
    every seed of every stratum (each difference weighted by 1 / (strata x its stratum's seeds), so
    the statistic flipped is the estimate itself) and its floor 2 / 2^n, and two equivalence tests
    (`tost_p`): within the paper's ±`band` and within the smallest band the tier resolves, ±mde;
    the seeds (units) the band would take at the pooled sd and at its interval's ends
    (`seeds_for_band`, `_low`, `_high`: `seeds_needed`). `different`: the t interval excludes 0 and the sign-flip p <= alpha = 1 - confidence.
    Verdicts: `equivalence_verdict` against each band."""
    alpha = 1 - confidence
    pooled = stratified_mean(strata, confidence, power)
    arrays = [np.asarray(v, dtype=np.float64) for v in strata.values() if len(v)]
    k, n = pooled["strata"], pooled["seeds"]
    weighted = np.concatenate([a / (k * a.size) for a in arrays])
    p = sign_flip_p(weighted) if n > 1 else math.nan
    low, high, mde = pooled["low"], pooled["high"], pooled["mde"]
    different = bool(math.isfinite(low) and (low > 0 or high < 0) and p <= alpha)
    p_band = tost_p(pooled["estimate"], pooled["se"], pooled["df"], band)
    p_mde = tost_p(pooled["estimate"], pooled["se"], pooled["df"], mde) if math.isfinite(mde) else math.nan
    sigma = [pooled[k] for k in ("sd", "sd_low", "sd_high")]
    needed = [seeds_needed(x, band, alpha, power) if math.isfinite(x) else math.nan for x in sigma]
    return {
        **pooled,
        "seeds_for_band": needed[0],
        "seeds_for_band_low": needed[1],
        "seeds_for_band_high": needed[2],
        "p": p,
        "p_floor": min(1.0, 2.0 / 2**n),
        "different": different,
        "band": band,
        "tost_p_band": p_band,
        "verdict_band": equivalence_verdict(different, p_band, band, alpha, fmt),
        "tost_p_mde": p_mde,
        "verdict_mde": equivalence_verdict(different, p_mde, mde, alpha, fmt) if math.isfinite(mde) else "",
    }


TREND_WORDS = ("grows with depth", "shrinks with depth", "no trend this tier resolves")


def depth_trend(
    depths: Sequence[int],
    groups: Sequence[Sequence[float]],
    confidence: float = 0.95,
    resamples: int = 10000,
    seed: int = 0,
) -> dict:
    """The trend of a measure against depth: the least-squares slope of the depths' means m_d
    against x_d = log2(depth) (so its unit is the measure's per doubling of depth), each depth
    weighing the same, and beside it every adjacent contrast (the next depth's mean minus this
    one's, in the order of increasing depth). `groups` holds one array per depth: its independent
    units, one value a training seed (a seed's paired difference, or the mean of a seed's runs:
    `per_seed`), whose mean is the depth's estimate.

    The slope is a fixed contrast of the means, b = sum_d w_d m_d with w_d = (x_d - mean x) /
    sum (x - mean x)^2 (`contrast`: its Welch t interval and p), so the noise in it is the noise
    within the depths, not the depths' scatter about the line. With three evenly spaced log-depths
    the weights are (-1/2, 0, +1/2): the slope is the deepest against the shallowest alone, which is
    why the adjacent contrasts stand beside it (a hump shows there). The bootstrap draws each
    depth's units with replacement (depths kept) and takes the slope's percentiles. Returns depths,
    slope, se, df, low, high, p (t), boot_low, boot_high, `contrasts` (a list of dicts: deeper,
    shallower, estimate, low, high, p) and the verdict (`trend_verdict`); NaN where fewer than two
    depths (no slope) or a depth with one unit (no interval)."""
    x = np.log2(np.asarray(depths, dtype=np.float64))
    arrays = [np.asarray(g, dtype=np.float64) for g in groups]
    if len(arrays) != x.size or any(a.ndim != 1 or a.size == 0 for a in arrays):
        raise ValueError(f"depth_trend needs one non-empty 1-D sample per depth, got {len(arrays)} for {x.size} depths")
    if np.unique(x).size != x.size:
        raise ValueError(f"depth_trend needs distinct depths, got {list(depths)}")
    out = {
        "depths": int(x.size),
        "slope": math.nan,
        "se": math.nan,
        "df": math.nan,
        "low": math.nan,
        "high": math.nan,
        "p": math.nan,
        "boot_low": math.nan,
        "boot_high": math.nan,
        "contrasts": [],
    }
    if x.size < 2:
        return {**out, "verdict": trend_verdict(out)}
    order = np.argsort(x)
    for a, b in itertools.pairwise(order):
        step = contrast([arrays[a], arrays[b]], [-1.0, 1.0], confidence)
        out["contrasts"].append(
            {
                "deeper": int(depths[b]),
                "shallower": int(depths[a]),
                **{k: step[k] for k in ("estimate", "low", "high", "p")},
            }
        )
    w = (x - x.mean()) / np.sum((x - x.mean()) ** 2)
    slope = contrast(arrays, w, confidence)
    out.update(slope=slope["estimate"], **{k: slope[k] for k in ("se", "df", "low", "high", "p")})
    if all(a.size > 1 for a in arrays):
        rng = np.random.default_rng(seed)
        drawn = sum(wd * a[rng.integers(0, a.size, size=(resamples, a.size))].mean(axis=1) for wd, a in zip(w, arrays))
        tail = (1 - confidence) / 2
        out["boot_low"], out["boot_high"] = (float(v) for v in np.quantile(drawn, [tail, 1 - tail]))
    return {**out, "verdict": trend_verdict(out)}


def trend_verdict(trend: dict, p_holm: float = math.nan, alpha: float | None = None) -> str:
    """ "grows with depth" or "shrinks with depth" where the t interval and the bootstrap of a
    `depth_trend` slope both exclude 0 on the same side, the units vary at all (identical values
    give a t interval of no width, which shows nothing) and every adjacent contrast has the
    slope's sign (no hump, no dip); with `alpha`, also where the slope's Holm-adjusted p over its
    family (`p_holm`) is at most alpha. "no trend this tier resolves" otherwise."""
    sides = []
    for low, high in ((trend["low"], trend["high"]), (trend["boot_low"], trend["boot_high"])):
        sides.append(1 if low > 0 else -1 if high < 0 else 0)  # NaN bounds compare False: side 0
    agree = all(np.sign(c["estimate"]) == sides[0] for c in trend.get("contrasts", []))
    held = alpha is None or p_holm <= alpha
    if trend["se"] > 0 and sides[0] != 0 and sides[0] == sides[1] and agree and held:
        return TREND_WORDS[0] if sides[0] > 0 else TREND_WORDS[1]
    return TREND_WORDS[2]


RANK_Z = 1.959964 * math.sqrt(2)  # SNR below which the two most distant models are not told apart (see task_snr)


def task_snr(scores: dict[str, Sequence[float]]) -> dict:
    """Signal-and-noise (allenai/signal-and-noise, 2025) for one task: `scores` holds each model's
    repeated scores (its last checkpoints, or its training seeds). signal = max_jk |m_j - m_k| /
    mean(m) over the models' mean scores m; noise = the models' sd of their own scores (np.std,
    ddof 0, as the reference; pooled: the root mean of their variances) / the mean of all scores;
    snr = signal / noise. `decision_accuracy`: the chance that one evaluation of each of two
    models ranks them as their means do, Phi(|m_j - m_k| / (sd sqrt 2)), averaged over the pairs.
    `can_rank`: snr >= 1.96 sqrt 2 (about 2.77): below it even the two most distant models'
    scores differ by less than 1.96 sd of a difference, so no pair is told apart at 5% and the
    task cannot rank these models. NaN (and can_rank False) with fewer than two models, no
    repeated score or a mean score of 0 (every model scoring 0: no relative spread)."""
    from scipy import stats as sps  # imported here: a second of import time most callers need not pay

    arrays = [np.asarray(v, dtype=np.float64) for v in scores.values()]
    out = {
        "models": len(arrays),
        "signal": math.nan,
        "noise": math.nan,
        "snr": math.nan,
        "decision_accuracy": math.nan,
        "can_rank": False,
    }
    if len(arrays) < 2 or any(a.size < 2 for a in arrays):
        return out
    means = np.array([a.mean() for a in arrays])
    sd = math.sqrt(np.mean([a.var() for a in arrays]))
    grand = float(np.concatenate(arrays).mean())
    if grand == 0 or means.mean() == 0:
        return out
    signal = float((means.max() - means.min()) / means.mean())
    noise = sd / grand
    gaps = np.abs(means[:, None] - means[None, :])[np.triu_indices(len(means), 1)]
    accuracy = float(np.mean(sps.norm.cdf(gaps / (sd * math.sqrt(2))))) if sd > 0 else 1.0
    snr = signal / noise if noise > 0 else math.inf
    return {
        **out,
        "signal": signal,
        "noise": noise,
        "snr": snr,
        "decision_accuracy": accuracy,
        "can_rank": bool(snr >= RANK_Z),
    }


ACCUMULATION_WORDS = ("grows", "shrinks", "no trend resolved")


def paired_by_step(a: dict[int, float], b: dict[int, float]) -> tuple[np.ndarray, np.ndarray]:
    """(steps, a - b) at the steps both hold, ascending: two runs' per-step train losses, which are
    paired by batch where the two read the same batches (the two arms of a training seed)."""
    steps = np.array(sorted(set(a) & set(b)), dtype=np.int64)
    return steps, np.array([a[s] - b[s] for s in steps], dtype=np.float64)


def trailing_smooth(steps: Sequence[int], values: Sequence[float], window: int) -> np.ndarray:
    """At each step s, the mean of the values at steps in (s - window, s] (the last `window`
    optimizer steps; fewer at the start). `steps` ascending."""
    s, v = np.asarray(steps, dtype=np.int64), np.asarray(values, dtype=np.float64)
    if window < 1:
        raise ValueError(f"the smoothing window must be at least 1 step, got {window}")
    sums = np.concatenate([[0.0], np.cumsum(v)])
    first = np.searchsorted(s, s - window, side="right")
    ends = np.arange(1, s.size + 1)
    return (sums[ends] - sums[first]) / (ends - first)


def accumulation_slope(steps: Sequence[int], differences: Sequence[float], window: int) -> float:
    """The least-squares slope, per step, of the smoothed paired difference (`trailing_smooth` over
    `window` steps) against the step, over the second half of training: the steps after half the
    last one. A trailing mean leaves a linear trend's slope as it is (it shifts the line by
    (window - 1) / 2 steps), so on a line the slope is exact. NaN with fewer than 2 such steps."""
    s = np.asarray(steps, dtype=np.float64)
    smoothed = trailing_smooth(steps, differences, window)
    late = s > s.max() / 2
    if late.sum() < 2:
        return math.nan
    x, y = s[late] - s[late].mean(), smoothed[late]
    return float((x * (y - y.mean())).sum() / (x * x).sum())


def accumulation(series: dict, window: int, confidence: float) -> dict:
    """Does the paired difference (baseline minus the other run) grow over the second half of
    training, or shrink? `series`: per training seed, (steps, differences) of its two runs' per-step
    train losses (`paired_by_step`). Each seed gives one slope (`accumulation_slope`), the seeds
    are the units: `across_seeds` of the slopes (mean, t interval, sign-flip p), `change`, the mean
    slope times the second half's length in steps (what the lead gains over it), and the verdict:
    "grows" where the t interval lies above 0 (the note's long-horizon effect: the lead
    accumulates), "shrinks" where below (a faster start that the other run catches up), else "no
    trend resolved"."""
    slopes = {seed: accumulation_slope(steps, d, window) for seed, (steps, d) in series.items()}
    values = [v for v in slopes.values() if not math.isnan(v)]
    if not values:
        raise StreambackError("the accumulation test needs at least one seed with two steps in its second half")
    summary = across_seeds(values, confidence)
    last = max(int(np.max(steps)) for steps, _ in series.values())
    side = 1 if summary["low"] > 0 else -1 if summary["high"] < 0 else 0  # NaN bounds (one seed): 0
    return {
        **summary,
        "slopes": slopes,
        "half_steps": last - last // 2,
        "change": summary["mean"] * (last - last // 2),
        "verdict": ACCUMULATION_WORDS[0] if side > 0 else ACCUMULATION_WORDS[1] if side < 0 else ACCUMULATION_WORDS[2],
    }
