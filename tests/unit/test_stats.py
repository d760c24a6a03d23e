"""The study's statistics (streamback.stats) on hand-built cases with known
answers, and against scipy and statsmodels where they have the same test."""

import itertools
import math

import numpy as np
import pytest
from scipy import stats as sps
from statsmodels.stats.contingency_tables import mcnemar
from statsmodels.stats.multitest import multipletests

from streamback import stats
from streamback.errors import StreambackError


def test_mcnemar_exact_by_hand_and_against_statsmodels_and_scipy():
    # derived: binomial tails by hand, sums of a few exact terms (fp64 roundings only), here and below
    assert stats.mcnemar_exact(0, 6) == pytest.approx(2 / 64)  # all six discordant items one way: 2 * 2^-6
    assert stats.mcnemar_exact(1, 9) == pytest.approx(2 * (1 + 10) / 1024)
    assert stats.mcnemar_exact(5, 5) == 1.0 and stats.mcnemar_exact(0, 0) == 1.0
    assert stats.mcnemar_exact(0, 5) > 0.05 > stats.mcnemar_exact(0, 6)  # six is the fewest that can reject at 5%
    for b, c in itertools.product([0, 1, 2, 3, 7, 20, 55], [0, 1, 4, 9, 30, 61]):
        # derived: statsmodels' and scipy's exact tails are the same binomial sums (terms up to 116: ~1e-14); 1e-10 is
        # wider
        want = mcnemar([[10, b], [c, 10]], exact=True).pvalue if b + c else 1.0
        assert stats.mcnemar_exact(b, c) == pytest.approx(want, rel=1e-10)
        if b + c:
            assert stats.mcnemar_exact(b, c) == pytest.approx(sps.binomtest(b, b + c, 0.5).pvalue, rel=1e-10)
    assert stats.discordant([1, 1, 0, 0, 1], [1, 0, 1, 1, 1]) == (1, 2)


def test_holm_by_hand_and_against_statsmodels():
    # derived: Holm's products by hand (one fp64 rounding each), here and below
    assert stats.holm([0.01, 0.04, 0.03]) == pytest.approx([0.03, 0.06, 0.06])
    assert stats.holm([0.5, 0.001]) == pytest.approx([0.5, 0.002])
    assert stats.holm([0.04, 0.03]) == pytest.approx([0.06, 0.06])  # step-down: never below an earlier adjusted value
    adjusted = stats.holm([0.02, float("nan"), 0.01])
    assert math.isnan(adjusted[1]) and adjusted[0] == pytest.approx(0.02) and adjusted[2] == pytest.approx(0.02)
    rng = np.random.default_rng(3)
    for m in (1, 2, 5, 9, 27):
        p = rng.uniform(0, 0.2, m) ** 2
        # derived: statsmodels' Holm is the same products and running maxima (one rounding each): 1e-12 is wider
        assert stats.holm(p) == pytest.approx(multipletests(p, method="holm")[1].tolist(), rel=1e-12)


def test_paired_bootstrap_interval_known_answers():
    same = [0, 1, 1, 0, 1] * 20
    assert stats.paired_bootstrap_ci(same, same) == (0.0, 0.0, 0.0)
    a = np.linspace(0, 1, 50)
    diff, low, high = stats.paired_bootstrap_ci(a, a + 0.25)
    # derived: means of fp64 values shifted by 0.25 (a few 2^-53)
    assert diff == low == high == pytest.approx(0.25)  # a constant difference has no spread
    # 10 of 100 items right in the second run only: the resampled difference is Binomial(100, 0.1) / 100,
    # so the 95% percentile interval is its 2.5% and 97.5% quantiles
    a, b = [0] * 100, [1] * 10 + [0] * 90
    diff, low, high = stats.paired_bootstrap_ci(a, b, resamples=20000, seed=1)
    assert diff == pytest.approx(0.1)
    # derived: the resampled difference lives on a grid of 0.01 and 20000 resamples put its 2.5% and 97.5%
    # percentiles (Monte Carlo sd ~0.0003) on the exact quantile or the next grid point: one step, 0.01, and rounding
    assert low == pytest.approx(sps.binom.ppf(0.025, 100, 0.1) / 100, abs=0.011)
    assert high == pytest.approx(sps.binom.ppf(0.975, 100, 0.1) / 100, abs=0.011)
    with pytest.raises(ValueError):
        stats.paired_bootstrap_ci([1, 0], [1])


def test_paired_bootstrap_interval_against_scipy():
    rng = np.random.default_rng(0)
    a = (rng.random(300) < 0.6).astype(int)
    b = np.where(rng.random(300) < 0.15, 1 - a, a)  # 15% of the items flip
    diff, low, high = stats.paired_bootstrap_ci(a, b, resamples=20000, seed=2)
    ref = sps.bootstrap(
        (a, b),
        lambda x, y: np.mean(y - x),
        paired=True,
        vectorized=False,
        n_resamples=20000,
        method="percentile",
        random_state=np.random.default_rng(5),
    ).confidence_interval
    assert diff == pytest.approx(np.mean(b - a))
    # derived: two percentile bootstraps (20000 each, other seeds) of a mean on a grid of 1/300 (0.0033): one grid step
    # plus their Monte Carlo sd (~4e-4 each, the difference's sd 0.022): 0.006
    assert low == pytest.approx(ref.low, abs=0.006) and high == pytest.approx(ref.high, abs=0.006)
    half = 1.96 * np.std(b - a) / np.sqrt(len(a))  # the normal approximation, which the percentile interval nears
    # derived: the half-width 0.044 on a grid of 1/300 (7.5% of it) plus the normal approximation's O(1/sqrt(300)): 0.1
    assert (high - low) / 2 == pytest.approx(half, rel=0.1)


def _power_by_enumeration(n: int, p_disc: float, delta: float, alpha: float) -> float:
    """Every outcome of n items (b items right in the first run only, c in the second only, the rest
    concordant), weighted by its multinomial probability, tested with statsmodels' exact McNemar."""
    p_c, p_b = (p_disc + delta) / 2, (p_disc - delta) / 2
    power = 0.0
    for b in range(n + 1):
        for c in range(n + 1 - b):
            prob = math.comb(n, b) * math.comb(n - b, c) * p_b**b * p_c**c * (1 - p_disc) ** (n - b - c)
            if b + c and mcnemar([[0, b], [c, 0]], exact=True).pvalue <= alpha:
                power += prob
    return power


@pytest.mark.parametrize("n, p_disc, delta", [(12, 0.5, 0.2), (20, 0.3, 0.3), (25, 0.2, 0.1), (30, 0.6, 0.0)])
def test_mcnemar_power_equals_enumeration(n, p_disc, delta):
    # derived: the same enumeration of the same binomial terms in fp64 (a few hundred terms: ~1e-14): 1e-12
    assert stats.mcnemar_power(n, p_disc, delta) == pytest.approx(
        _power_by_enumeration(n, p_disc, delta, 0.05), abs=1e-12
    )


def test_min_detectable_difference():
    for n, p_disc in ((200, 0.1), (1000, 0.2), (2000, 0.05)):
        mdd = stats.min_detectable_difference(n, p_disc, tol=1e-5)
        assert (
            stats.mcnemar_power(n, max(p_disc, mdd), mdd)
            >= 0.8
            > stats.mcnemar_power(n, max(p_disc, mdd - 2e-5), mdd - 2e-5)
        )
        # Connor (1987)'s normal approximation for paired proportions, solved for the difference
        z_a, z_b = sps.norm.ppf(0.975), sps.norm.ppf(0.8)
        connor = next(
            d
            for d in np.arange(1e-5, p_disc, 1e-5)
            if z_a * math.sqrt(p_disc) + z_b * math.sqrt(p_disc - d * d) <= d * math.sqrt(n)
        )
        assert (
            mdd == pytest.approx(connor, rel=0.06) and mdd >= connor * 0.98
        )  # the exact test is a little more conservative
    # runs that never disagree: a difference d needs d of the items discordant, all one way, and at
    # least six discordant items to reject; with 100 items that takes d ~ 0.08 for 80% of the time
    mdd = stats.min_detectable_difference(100, 0.0)
    assert sps.binom.sf(5, 100, mdd) >= 0.8 > sps.binom.sf(5, 100, mdd - 2e-4)
    assert math.isnan(stats.min_detectable_difference(5, 0.3))  # five items can never reach p < 0.05
    assert stats.min_detectable_difference(500, 0.1) < stats.min_detectable_difference(100, 0.1)


# ---- across training seeds --------------------------------------------------------------------


def test_t_interval_and_across_seeds_against_scipy():
    x = [0.012, -0.004, 0.02, 0.007]
    mean, low, high = stats.t_interval(x, 0.95)
    want = sps.t.interval(0.95, len(x) - 1, loc=np.mean(x), scale=sps.sem(x))
    # derived: scipy's t interval is the same quantile and arithmetic in fp64 (a few 2^-53)
    assert mean == pytest.approx(np.mean(x)) and (low, high) == pytest.approx(want, rel=1e-12)
    summary = stats.across_seeds(x, 0.95)
    # exact sign-flip p: of the 16 sign patterns only the observed one (sum 0.035), the one with -0.004
    # turned (0.043) and their mirrors reach |sum| 0.035
    # exact: 4 of 16 sign patterns (approx for fp64 division); the sd below: the same formula (fp64 only)
    assert summary["p"] == pytest.approx(4 / 16) and summary["p_floor"] == 2 / 16
    assert (summary["n"], summary["sd"], summary["min"], summary["max"]) == (
        4,
        pytest.approx(np.std(x, ddof=1)),
        -0.004,
        0.02,
    )
    one = stats.across_seeds([0.5], 0.95)
    assert one["n"] == 1 and one["mean"] == 0.5 and all(math.isnan(one[k]) for k in ("sd", "low", "high", "p"))
    # two seeds: one degree of freedom, t = 12.706
    # derived: t(0.975, 1) to 9 digits by hand (12.7062047): 1e-6 relative holds its last digit
    assert stats.t_interval([1.0, 3.0], 0.95)[2] == pytest.approx(
        2.0 + 12.7062047 * math.sqrt(2) / math.sqrt(2), rel=1e-6
    )


def test_hierarchical_bootstrap_against_exact_enumeration_and_the_variance_formula():
    # no spread within seeds: the resamples are means of 3 seed values drawn with replacement, 27 equally likely triples
    groups = [[0.0] * 5, [1.0] * 5, [2.0] * 5]
    estimate, low, high = stats.hierarchical_bootstrap(groups, 0.9, resamples=40000, seed=1)
    triples = np.array([np.mean(t) for t in itertools.product([0.0, 1.0, 2.0], repeat=3)])
    assert estimate == 1.0 and (low, high) == (
        np.quantile(np.repeat(triples, 1000), 0.05),
        np.quantile(np.repeat(triples, 1000), 0.95),
    )
    # spread both between and within seeds: the resampled mean's variance is (var_between (k-1)/k + mean
    # var_within (n-1)/n / n) / k
    rng = np.random.default_rng(0)
    groups = [rng.normal(mu, 1.0, 200) for mu in (0.1, 0.3, 0.2, 0.5, 0.4, 0.3)]
    k, n = len(groups), 200
    means = np.array([g.mean() for g in groups])
    var = (means.var() + np.mean([g.var() for g in groups]) / n) / k
    estimate, low, high = stats.hierarchical_bootstrap(groups, 0.95, resamples=20000, seed=2)
    assert estimate == pytest.approx(means.mean())
    assert (high - low) / 2 == pytest.approx(1.959964 * math.sqrt(var), rel=0.1)
    # one seed: the item bootstrap of that seed
    only = stats.hierarchical_bootstrap([groups[0]], 0.95, resamples=20000, seed=3)
    assert (only[2] - only[1]) / 2 == pytest.approx(1.959964 * groups[0].std() / math.sqrt(n), rel=0.1)
    with pytest.raises(ValueError):
        stats.hierarchical_bootstrap([[1.0], []])


def points(x, sign=True):
    return f"{100 * x:+.1f}" if sign else f"{100 * x:.1f}"


def verdict_of(differences, significant, noise=0.01):
    summary = stats.across_seeds(differences, 0.95)
    summary["boot_low"], summary["boot_high"] = min(differences), max(differences)
    return stats.seed_verdict(summary, significant, noise, points, "better", "worse")


def test_a_difference_significant_in_every_seed_but_flipping_sign_is_within_seed_noise():
    text = verdict_of([0.03, -0.03, 0.029], [True, True, True])
    assert text.startswith("within seed noise: +1.0 on average, significant within some seeds, but of opposite signs")
    assert "per-seed differences -3.0 to +3.0" in text and "sd 1.0 from seed to seed" in text
    assert verdict_of([0.03, 0.031, 0.029], [True, True, True]).startswith("consistent across seeds: better by 3.0 (")
    assert verdict_of([-0.03, -0.031, -0.029], [False] * 3).startswith("consistent across seeds: worse by 3.0")
    assert verdict_of([0.01, -0.002, 0.004], [False] * 3).startswith(
        "within seed noise: +0.4 on average, the interval over seeds includes 0"
    )
    assert verdict_of([0.03], [True]).startswith("one training seed: training randomness is not covered")


def test_depth_trend_by_hand():
    """Depths 2, 4, 8 (log2: 1, 2, 3): weights -1/2, 0, 1/2; means 1.0, 1.5, 2.0, so the slope is
    0.5 a doubling; its variance and Welch-Satterthwaite degrees of freedom by hand."""
    groups = [[1.0, 1.2, 0.8], [1.5, 1.6, 1.4], [2.0, 2.4, 1.6]]
    trend = stats.depth_trend([2, 4, 8], groups, 0.95, resamples=4000)
    parts = [0.25 * 0.04 / 3, 0.0, 0.25 * 0.16 / 3]  # w^2 s^2 / n; the middle depth's weight is 0
    variance = sum(parts)
    df = variance**2 / (parts[0] ** 2 / 2 + parts[2] ** 2 / 2)
    half = sps.t.ppf(0.975, df) * math.sqrt(variance)
    # derived: the same formulas by hand (fp64 roundings only); 2.941: the df by hand to 3 decimals (abs 1e-3)
    assert trend["slope"] == pytest.approx(0.5) and trend["se"] == pytest.approx(math.sqrt(variance))
    assert trend["df"] == pytest.approx(df) and df == pytest.approx(2.941, abs=1e-3)
    assert (trend["low"], trend["high"]) == pytest.approx((0.5 - half, 0.5 + half))
    assert trend["boot_low"] > 0 and trend["boot_high"] < 1.0 and trend["verdict"] == "grows with depth"
    # the same slope, as a least-squares fit of every depth's mean (scipy's linregress over the three means)
    # derived: scipy's least squares on the same three means (fp64 roundings only)
    assert trend["slope"] == pytest.approx(sps.linregress(np.log2([2, 4, 8]), [1.0, 1.5, 2.0]).slope)


def test_depth_trend_of_the_paper_s_depths_and_its_verdicts():
    """80, 40, 20 layers: a measure falling by 0.1 a doubling is 'shrinks'; a noisy one is not resolved;
    identical values (no spread) are never a trend; one depth or one unit gives no slope or interval."""
    rng = np.random.default_rng(1)
    depths = [80, 40, 20]
    falling = [0.4 - 0.1 * np.log2(d / 20) + rng.normal(0, 0.005, 6) for d in depths]
    trend = stats.depth_trend(depths, falling)
    assert trend["slope"] == pytest.approx(-0.1, abs=0.01) and trend["verdict"] == "shrinks with depth"
    assert trend["slope"] == pytest.approx(sps.linregress(np.log2(depths), [g.mean() for g in falling]).slope)
    noisy = [0.01 * np.log2(d) + rng.normal(0, 1.0, 3) for d in depths]
    assert stats.depth_trend(depths, noisy)["verdict"] == "no trend this tier resolves"
    flat = stats.depth_trend(depths, [[1.0, 1.0], [2.0, 2.0], [3.0, 3.0]])
    assert flat["se"] == 0 and flat["verdict"] == "no trend this tier resolves"
    one = stats.depth_trend([8], [[1.0, 2.0]])
    assert math.isnan(one["slope"]) and one["verdict"] == "no trend this tier resolves"
    single = stats.depth_trend([2, 8], [[1.0], [2.0]])
    assert single["slope"] == pytest.approx(0.5) and math.isnan(single["low"])
    assert single["verdict"] == "no trend this tier resolves"
    with pytest.raises(ValueError, match="distinct depths"):
        stats.depth_trend([8, 8], [[1.0], [2.0]])


def test_the_across_seed_row_is_built_in_one_place_from_the_seeds():
    """stats.seed_row, which the loss and the task-score tables both use: three seeds' differences
    1, 2, 3 give mean 2, sd 1 and the t interval 2 -+ t(0.975, 2) / sqrt 3 = 2 -+ 2.4841."""
    items = [[0.5, 1.5], [1.0, 3.0], [2.0, 4.0]]
    fields, summary = stats.seed_row([1.0, 2.0, 3.0], items, [4.0, 4.5, 5.0], 0.95, 0.8, {"target": 0.5, "band": 2.0})
    # derived: the same figures by hand; t(0.975, 2) / sqrt 3 to 8 digits (2.4841377, within approx's 1e-6)
    assert summary["mean"] == pytest.approx(2.0) and fields["sd"] == pytest.approx(1.0)
    assert (fields["ci_low"], fields["ci_high"]) == pytest.approx((2 - 2.4841377, 2 + 2.4841377))
    assert fields["seeds"] == 3 and fields["baseline_sd"] == pytest.approx(0.5) and fields["p_seeds"] == 0.25
    assert fields["boot_low"] <= 2.0 <= fields["boot_high"] and summary["boot_low"] == fields["boot_low"]
    assert fields["within_se"] == pytest.approx(stats.within_se(items))
    sigma = max(1.0, fields["within_se"])
    assert fields["target"] == 0.5 and fields["seeds_for_target"] == stats.seeds_needed(sigma, 0.5, 0.05, 0.8)
    assert fields["band"] == 2.0 and fields["seeds_for_band"] == stats.seeds_needed(sigma, 2.0, 0.05, 0.8)
    assert fields["mde"] == stats.seed_mde(1.0, 3, 0.05, 0.8, fields["within_se"])


# --- accumulation: the slope of the paired difference over the second half ---------------------


def test_paired_by_step_pairs_the_steps_both_runs_logged():
    steps, d = stats.paired_by_step({1: 3.0, 2: 2.5, 3: 2.0}, {2: 2.25, 3: 2.5, 4: 1.0})
    assert steps.tolist() == [2, 3] and d.tolist() == [0.25, -0.5]


def test_trailing_smooth_by_hand():
    # window 2: each step's value and the one before it (the first alone)
    assert stats.trailing_smooth([1, 2, 3, 4], [1.0, 2.0, 3.0, 4.0], 2).tolist() == [1.0, 1.5, 2.5, 3.5]
    # by step, not by entry: step 5 is more than 2 steps after step 2
    assert stats.trailing_smooth([1, 2, 5], [1.0, 3.0, 7.0], 2).tolist() == [1.0, 2.0, 7.0]


def _series(slope: float, offset: float, wiggle: float, steps: int = 200) -> tuple[np.ndarray, np.ndarray]:
    """A seed's paired difference: a line plus a +-wiggle alternating step by step (which a trailing
    mean over an even window cancels exactly, once the window is full)."""
    s = np.arange(1, steps + 1)
    return s, offset + slope * s + wiggle * (-1.0) ** s


def test_accumulation_slope_of_a_line_is_its_slope():
    for slope in (0.002, -0.0005, 0.0):
        s, d = _series(slope, 0.01, 0.05)
        # exact up to fp64 rounding of sums over 100 steps of values below 1: 1e-12 is far above it
        assert stats.accumulation_slope(s, d, 10) == pytest.approx(slope, abs=1e-12)
    # an odd window leaves the wiggle in (1/9 of it, alternating): the slope moves, by little
    s, d = _series(0.002, 0.0, 0.05)
    assert stats.accumulation_slope(s, d, 9) != pytest.approx(0.002, abs=1e-12)
    assert stats.accumulation_slope(s, d, 9) == pytest.approx(0.002, abs=1e-4)
    # only the second half counts: a kink at step 100 leaves the late slope alone
    s = np.arange(1, 201)
    kinked = np.where(s <= 100, 0.01 * s, 1.0 + 0.003 * (s - 100))
    assert stats.accumulation_slope(s, kinked, 1) == pytest.approx(0.003, abs=1e-12)
    assert math.isnan(stats.accumulation_slope([2], [0.1], 1))


@pytest.mark.parametrize(
    ("slopes", "verdict"),
    [
        ([0.002, 0.0021, 0.0019], "grows"),
        ([-0.002, -0.0021, -0.0019], "shrinks"),
        ([0.001, 0.002, 0.003], "no trend resolved"),  # mean 0.002, but its t interval reaches below 0
    ],
)
def test_accumulation_over_seeds_by_hand(slopes, verdict):
    series = {seed: _series(b, 0.01 * seed, 0.03) for seed, b in enumerate(slopes)}
    out = stats.accumulation(series, window=10, confidence=0.95)
    assert [out["slopes"][k] for k in range(3)] == pytest.approx(slopes, abs=1e-12)
    mean, sd = np.mean(slopes), np.std(slopes, ddof=1)
    half = sps.t.ppf(0.975, 2) * sd / math.sqrt(3)  # the t interval over three seeds, two degrees of freedom
    assert out["n"] == 3 and out["mean"] == pytest.approx(mean, abs=1e-12)
    assert (out["low"], out["high"]) == pytest.approx((mean - half, mean + half), abs=1e-10)
    assert out["half_steps"] == 100 and out["change"] == pytest.approx(100 * mean, abs=1e-10)
    assert out["verdict"] == verdict
    assert out["p"] == 0.25  # three slopes of one sign: the sign-flip floor 2 / 2^3


def test_accumulation_needs_a_seed_with_a_second_half():
    with pytest.raises(StreambackError, match="at least one seed"):
        stats.accumulation({0: ([2], [0.1])}, window=1, confidence=0.95)
