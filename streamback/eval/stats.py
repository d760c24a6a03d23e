"""Is a benchmark difference between two runs real? Paired statistics on per-item correctness.

Two runs scored on the same n items give, per item, a pair of 0/1 outcomes (a: the baseline,
b: the other run). Everything here is paired on the items:
- `paired_bootstrap_ci`: the difference of the means, mean(b) - mean(a), with a percentile
  confidence interval from resampling items with replacement;
- `mcnemar_exact`: the exact McNemar test: of the discordant items (right in one run only),
  under no difference each is equally likely to favour either run, so the count favouring one is
  Binomial(discordant, 1/2); two-sided p = 2 x the smaller tail, at most 1;
- `holm`: Holm's step-down adjustment of a family of p-values (the tasks of a shape);
- `min_detectable_difference`: the smallest true difference the exact McNemar test at level
  alpha detects with the given power over n items, when the runs disagree on a fraction p_d of
  the items (the observed fraction, or the difference itself if that is larger: a difference of
  delta needs at least delta of the items discordant). Power is exact: the number of discordant
  items is Binomial(n, p_d), and given m of them the count favouring the better run is
  Binomial(m, (1 + delta / p_d) / 2).
Binomial probabilities are computed in log space from log-factorials (numpy only; the tests
check them against scipy and statsmodels).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence

import numpy as np


def paired_bootstrap_ci(a: Sequence[float], b: Sequence[float], confidence: float = 0.95, resamples: int = 10000,
                        seed: int = 0) -> tuple[float, float, float]:
    """(mean(b) - mean(a), lower, upper): the percentile interval of the mean difference over
    `resamples` resamples of the items (both runs' outcomes of an item drawn together)."""
    diff = np.asarray(b, dtype=np.float64) - np.asarray(a, dtype=np.float64)
    n = diff.size
    if n == 0 or np.asarray(a).shape != np.asarray(b).shape:
        raise ValueError(f"paired_bootstrap_ci needs two equally long, non-empty samples, got {np.asarray(a).shape} and {np.asarray(b).shape}")
    rng = np.random.default_rng(seed)
    means = np.empty(resamples)
    chunk = max(1, 4_000_000 // n)  # resamples per draw of indices (about 32 MB of int64)
    for start in range(0, resamples, chunk):
        stop = min(start + chunk, resamples)
        means[start:stop] = diff[rng.integers(0, n, size=(stop - start, n))].mean(axis=1)
    tail = (1 - confidence) / 2
    lower, upper = np.quantile(means, [tail, 1 - tail])
    return float(diff.mean()), float(lower), float(upper)


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
    tail = _binom_pmf(m, 0.5, _log_factorials(m))[:min(only_a, only_b) + 1].sum()
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
        power += weights[m] * (pmf[:k + 1].sum() + pmf[int(m) - k:].sum())
    return float(power)


def min_detectable_difference(n: int, p_discordant: float, alpha: float = 0.05, power: float = 0.8, tol: float = 1e-4) -> float:
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
