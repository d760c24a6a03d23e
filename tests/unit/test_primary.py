"""The statistics a reviewer asked for (streamback.stats): one value a seed (`per_seed`), fixed
contrasts with Welch's interval (`contrast`, the adjacent depths of `depth_trend`), the sd's
chi-square interval, two one-sided tests of equivalence (`tost_p`) and the tier's primary test
(`primary_test`), each against scipy, statsmodels or a hand computation."""

import itertools
import math

import numpy as np
import pytest
from scipy import stats as sps
from statsmodels.stats.weightstats import ttost_paired

from streamback import stats


def test_per_seed_is_the_mean_of_each_seed_s_runs():
    assert stats.per_seed([1.0, 3.0, 2.0, 2.0, 5.0], [0, 0, 1, 1, 2]).tolist() == [2.0, 2.0, 5.0]
    assert stats.per_seed([1.0, math.nan, math.nan, math.nan], ["a", "a", "b", "b"]).tolist() == [1.0]
    with pytest.raises(ValueError, match="one seed per value"):
        stats.per_seed([1.0, 2.0], [0])


def test_contrast_against_scipy_s_welch_test():
    """A two-group contrast (-1, +1) is Welch's two-sample t: its interval, df and p are scipy's."""
    a, b = [1.0, 1.4, 0.9, 1.3], [2.0, 2.6, 1.5]
    c = stats.contrast([a, b], [-1.0, 1.0], 0.95)
    welch = sps.ttest_ind(b, a, equal_var=False)
    ci = welch.confidence_interval(0.95)
    assert c["estimate"] == pytest.approx(np.mean(b) - np.mean(a))
    assert (c["low"], c["high"]) == pytest.approx((ci.low, ci.high)) and c["df"] == pytest.approx(welch.df)
    assert c["p"] == pytest.approx(welch.pvalue)
    one = stats.contrast([[1.0], [2.0, 3.0]], [-1.0, 1.0])
    assert one["estimate"] == 1.5 and math.isnan(one["low"])  # a weighted group of one unit: no interval
    flat = stats.contrast([[1.0, 1.0], [2.0, 2.0]], [-1.0, 1.0])
    assert flat["se"] == 0 and flat["low"] == flat["high"] == 1.0 and math.isnan(flat["p"])


def test_the_adjacent_contrasts_show_a_hump_the_slope_cannot():
    """Three evenly spaced log-depths weigh the middle one 0: means 0, 1, 0 have slope 0 but contrasts +1
    and -1; means 0, 2, 1 have a slope whose interval excludes 0, yet the contrasts disagree, so no trend."""
    noise = np.array([-0.01, 0.0, 0.01])
    hump = stats.depth_trend([20, 40, 80], [noise, 1 + noise, noise], resamples=2000)
    assert hump["slope"] == pytest.approx(0, abs=1e-12)
    (up, down) = hump["contrasts"]
    assert (up["deeper"], up["shallower"], down["deeper"], down["shallower"]) == (40, 20, 80, 40)
    assert up["estimate"] == pytest.approx(1) and down["estimate"] == pytest.approx(-1)
    want = sps.ttest_ind(1 + noise, noise, equal_var=False).confidence_interval(0.95)
    assert (up["low"], up["high"]) == pytest.approx((want.low, want.high))
    assert hump["verdict"] == "no trend this tier resolves"
    tilted = stats.depth_trend([20, 40, 80], [noise, 2 + noise, 1 + noise], resamples=2000)
    assert tilted["low"] > 0 and tilted["boot_low"] > 0  # the slope alone would say "grows"
    assert tilted["verdict"] == "no trend this tier resolves"
    steady = stats.depth_trend([80, 20, 40], [2 + noise, noise, 1 + noise], resamples=2000)  # any order of depths
    assert [c["estimate"] for c in steady["contrasts"]] == pytest.approx([1, 1])
    assert steady["verdict"] == "grows with depth"
    assert stats.trend_verdict(steady, p_holm=0.2, alpha=0.05) == "no trend this tier resolves"  # not after Holm
    assert stats.trend_verdict(steady, p_holm=0.01, alpha=0.05) == "grows with depth"
    assert steady["p"] == pytest.approx(2 * sps.t.sf(steady["slope"] / steady["se"], steady["df"]))


def test_the_sd_s_chi_square_interval_by_hand():
    """Three values (2 degrees of freedom): sd x sqrt(2 / 7.3778) to sd x sqrt(2 / 0.050636)."""
    low, high = stats.sd_interval(1.0, 2, 0.95)
    assert (low, high) == pytest.approx((math.sqrt(2 / 7.377759), math.sqrt(2 / 0.0506356)), rel=1e-5)
    assert 0.52 < low < 0.53 and 6.2 < high < 6.3  # the "0.5 to 6 times"
    assert all(math.isnan(v) for v in stats.sd_interval(1.0, 0)) and math.isnan(stats.sd_interval(math.nan, 4)[0])


def test_the_seed_row_s_mde_and_seeds_carry_the_sd_s_range():
    items = [[0.5, 1.5], [1.0, 3.0], [2.0, 4.0]]
    fields, _ = stats.seed_row([1.0, 2.0, 3.0], items, [4.0, 4.5, 5.0], 0.95, 0.8, {"band": 0.5})
    low, high = stats.sd_interval(1.0, 2, 0.95)
    assert (fields["sd_low"], fields["sd_high"]) == pytest.approx((low, high))
    noise = fields["within_se"]
    assert fields["mde_low"] == pytest.approx(stats.seed_mde(low, 3, 0.05, 0.8, noise))
    assert fields["mde_high"] == pytest.approx(stats.seed_mde(high, 3, 0.05, 0.8, noise))
    assert fields["mde_low"] < fields["mde"] < fields["mde_high"]
    assert fields["seeds_for_band_low"] == stats.seeds_needed(max(low, noise), 0.5)
    assert fields["seeds_for_band_low"] <= fields["seeds_for_band"] <= fields["seeds_for_band_high"]


def test_tost_against_statsmodels_and_the_interval_inside_the_band():
    rng = np.random.default_rng(3)
    for shift, band in itertools.product((0.0, 0.3, 1.2), (0.5, 1.0, 2.0)):
        d = shift + rng.normal(0, 1.0, 12)
        se, df = d.std(ddof=1) / math.sqrt(d.size), d.size - 1
        p = stats.tost_p(d.mean(), se, df, band)
        assert p == pytest.approx(ttost_paired(d, np.zeros_like(d), -band, band)[0], rel=1e-10)
        ci = sps.t.interval(0.90, df, d.mean(), se)  # TOST at 5% <=> the 90% interval inside the band
        assert (p <= 0.05) == (-band < ci[0] and ci[1] < band)
    assert math.isnan(stats.tost_p(0.0, 0.0, 4, 1.0))


def test_the_equivalence_verdicts_in_words():
    assert stats.equivalence_verdict(False, 0.01, 0.001, 0.05) == "equivalent within ±0.001"
    assert stats.equivalence_verdict(True, 0.4, 0.001, 0.05) == "different"
    assert stats.equivalence_verdict(True, 0.01, 0.05, 0.05) == "different, but within ±0.05"
    assert stats.equivalence_verdict(False, 0.3, 0.001, 0.05, lambda x: f"{x:g} nats") == "inconclusive"
    assert stats.equivalence_verdict(False, math.nan, 0.001, 0.05) == "inconclusive"


def test_the_primary_test_pools_shapes_as_strata_and_seeds_as_units():
    """Three shapes of five seeds each, by hand: the mean of the shapes' means, its variance
    sum s^2 / n / 9, Welch-Satterthwaite's df, and the exact sign flip over the 15 seeds (2^15
    patterns, counted here by brute force)."""
    rng = np.random.default_rng(0)
    strata = {
        name: mean + rng.normal(0, sd, 5)
        for name, mean, sd in (("a", 0.017, 0.03), ("b", 0.034, 0.05), ("c", 0.021, 0.025))
    }
    test = stats.primary_test(strata, 0.95, 0.8, 0.001)
    arrays = list(strata.values())
    estimate = np.mean([a.mean() for a in arrays])
    parts = np.array([a.var(ddof=1) / 5 / 9 for a in arrays])
    df = parts.sum() ** 2 / np.sum(parts**2 / 4)
    half = sps.t.ppf(0.975, df) * math.sqrt(parts.sum())
    assert test["estimate"] == pytest.approx(estimate) and test["seeds"] == 15 and test["strata"] == 3
    assert (test["low"], test["high"]) == pytest.approx((estimate - half, estimate + half)) and test[
        "df"
    ] == pytest.approx(df)
    d = np.concatenate(arrays)  # equal seeds per shape: the weights are equal, so the plain sign flip
    signs = np.array(list(itertools.product((-1, 1), repeat=15)))
    assert test["p"] == pytest.approx(np.mean(np.abs(signs @ d) >= abs(d.sum()) - 1e-12))
    assert test["p_floor"] == pytest.approx(2 / 2**15)
    sd = math.sqrt(parts.sum() * 15)
    assert test["sd"] == pytest.approx(sd) and test["mde"] == pytest.approx(stats.seed_mde(sd, 15, 0.05, 0.8))
    low, high = stats.sd_interval(sd, df)
    assert test["mde_low"] == pytest.approx(stats.seed_mde(low, 15)) and test["mde_high"] == pytest.approx(
        stats.seed_mde(high, 15)
    )
    assert test["tost_p_band"] == pytest.approx(stats.tost_p(estimate, math.sqrt(parts.sum()), df, 0.001))
    assert test["different"] == (test["low"] > 0 and test["p"] <= 0.05)
    assert test["verdict_band"] in ("different", "inconclusive")  # ±0.001 is far inside these intervals


def test_the_primary_test_of_one_shape_is_the_paired_t_and_its_verdicts_follow():
    d = np.array([0.010, 0.012, 0.011, 0.009, 0.0105, 0.0095])
    test = stats.primary_test({"only": d}, 0.95, 0.8, 0.001)
    mean, low, high = stats.t_interval(d, 0.95)
    assert (test["estimate"], test["low"], test["high"]) == pytest.approx((mean, low, high))
    assert test["p"] == pytest.approx(2 / 64) and test["different"]
    assert test["verdict_band"] == "different"  # 0.0103 is not within ±0.001
    wide = stats.primary_test({"only": d}, 0.95, 0.8, 0.05)
    assert wide["verdict_band"] == "different, but within ±0.05"
    null = stats.primary_test({"only": d - d.mean()}, 0.95, 0.8, 0.01)
    assert not null["different"] and null["verdict_band"] == "equivalent within ±0.01"
    assert null["verdict_mde"] == "inconclusive" or null["verdict_mde"].startswith("equivalent within")
    uneven = stats.primary_test({"x": [1.0, 2.0], "y": [5.0, 6.0, 7.0, 8.0]}, 0.95, 0.8, 0.1)
    assert uneven["estimate"] == pytest.approx((1.5 + 6.5) / 2)  # each shape weighs the same
    weighted = np.concatenate([np.array([1.0, 2.0]) / 4, np.array([5.0, 6.0, 7.0, 8.0]) / 8])
    assert uneven["p"] == pytest.approx(stats.sign_flip_p(weighted))
