"""The across-seeds verdict rule, its exact p and the minimum detectable effect, on constructed
cases against hand computation, scipy, statsmodels and a simulation of the design."""

import itertools
import math

import numpy as np
import pytest
from scipy import stats as sps

from streamback import stats


def points(x, sign=True):
    return f"{100 * x:+.1f}" if sign else f"{100 * x:.1f}"


def verdict(groups, confidence=0.95):
    """The verdict of per-seed item differences, the way the tables compute it."""
    summary = stats.across_seeds([np.mean(g) for g in groups], confidence)
    _, summary["boot_low"], summary["boot_high"] = stats.hierarchical_bootstrap(groups, confidence, 10000, 0)
    return summary, stats.seed_verdict(summary, [False] * len(groups), 0.01, points, "better", "worse")


def test_one_item_of_a_hundred_in_each_of_three_seeds_is_not_consistent():
    # each seed: the other run is wrong on one item the baseline gets right, the same difference three times
    groups = [np.array([-1.0] + [0.0] * 99)] * 3
    summary, text = verdict(groups)
    # derived: means of equal fp64 values, a few roundings (approx's default 1e-6 relative)
    assert summary["sd"] == 0 and summary["low"] == summary["high"] == pytest.approx(-0.01)  # a t interval of no width
    # exact but for fp64 summation: the seeded bootstrap's quantile is a mean of resampled items, a multiple of 1/300
    assert (summary["boot_low"], summary["boot_high"]) == pytest.approx(
        (-0.07 / 3, 0.0)
    )  # the issue's -2.3 to 0.0 points: it reaches 0
    assert summary["p"] == 0.25 == summary["p_floor"]  # 2 of the 8 sign patterns reach |sum| 0.03: never p = 0
    assert text.startswith("within seed noise: -1.0 on average, the 3 seeds' differences are identical")
    assert "exact sign-flip p = 0.25, the smallest 3 seeds can give being 0.25" in text
    # identical differences that the items do resolve still rest on zero spread over seeds: not consistent
    wide = [np.array([-1.0] * 30 + [0.0] * 70)] * 3
    summary, text = verdict(wide)
    assert summary["boot_high"] < 0 and text.startswith("within seed noise")


def test_a_real_effect_of_five_sd_over_five_seeds_is_consistent():
    rng = np.random.default_rng(7)
    sd, effect = 0.01, 0.05
    seed_means = effect + sd * rng.standard_normal(5)
    groups = [m + 0.05 * rng.standard_normal(400) for m in seed_means]  # item noise 0.05 / 20 = sd / 4 per seed
    summary, text = verdict(groups)
    assert text.startswith("consistent across seeds: better by")
    # exact: the sign-flip p of five positive seeds is 2/32 (approx for fp64 division)
    assert summary["p"] == pytest.approx(2 / 32)  # every seed positive: the exact p is its floor
    # the same seeds with one sign turned are not
    groups[0] = -groups[0]
    assert verdict(groups)[1].startswith("within seed noise")


def test_sign_flip_p_against_enumeration_and_scipy():
    d = [0.3, -0.1, 0.5, 0.2, 0.4, -0.05]
    sums = [abs(sum(s * x for s, x in zip(signs, d))) for signs in itertools.product([1, -1], repeat=len(d))]
    # derived: the same enumeration; 1e-12 admits the order of fp64 summation of 6 terms ~0.3 (6 x 2^-53 x 1.5 = 1e-15)
    assert stats.sign_flip_p(d) == pytest.approx(np.mean(np.array(sums) >= abs(sum(d)) - 1e-12))
    want = sps.permutation_test(
        (np.array(d),), np.mean, permutation_type="samples", n_resamples=np.inf, alternative="two-sided"
    ).pvalue
    # derived: scipy's exact permutation test is the same count of 64 sign patterns (fp64 division only)
    assert stats.sign_flip_p(d) == pytest.approx(want)
    assert stats.sign_flip_p([0.0, 0.0, 0.0]) == 1.0 and stats.sign_flip_p([0.2, 0.2]) == 0.5  # two seeds: 2 of 4
    many = np.full(24, 0.1)
    # exact: the Monte Carlo floor 1 / (draws + 1) (approx for fp64 division)
    assert stats.sign_flip_p(many, draws=20000) == pytest.approx(1 / 20001)  # Monte Carlo: the floor is its own


def test_seed_mde_against_statsmodels_and_a_simulation_of_the_design():
    from statsmodels.stats.power import TTestPower

    for n in (3, 5, 10):
        want = TTestPower().solve_power(effect_size=None, nobs=n, alpha=0.05, power=0.8, alternative="two-sided")
        # derived: one noncentral-t power equation, two root finders: their stopping tolerances (1e-8 or finer) are far
        # below 1e-4
        assert stats.seed_mde(1.0, n) == pytest.approx(want, rel=1e-4)
    # the design: 5 seeds, each difference = effect + seed noise (sd 0.004) + the mean of 200 window
    # differences (sd 0.03 each); the tables measure the per-seed differences' sd and the window noise
    rng = np.random.default_rng(3)
    n, windows, seed_sd, window_sd = 5, 200, 0.004, 0.03
    total = math.sqrt(seed_sd**2 + window_sd**2 / windows)
    mde = stats.seed_mde(total, n, within_se=window_sd / math.sqrt(windows))
    critical = sps.t.ppf(0.975, n - 1)

    def power(effect, trials=6000):
        d = (
            effect
            + seed_sd * rng.standard_normal((trials, n))
            + window_sd * rng.standard_normal((trials, n, windows)).mean(axis=2)
        )
        t = d.mean(axis=1) / (d.std(axis=1, ddof=1) / math.sqrt(n))
        return np.mean(np.abs(t) > critical)

    assert power(0.9 * mde) < 0.8 < power(1.1 * mde)  # the simulated 80%-power effect is within 10% of the MDE
    # derived: a power from 6000 seeded trials has binomial sd sqrt(0.8 x 0.2 / 6000) = 0.005: 0.025 is 4.8 sd
    assert power(mde) == pytest.approx(0.8, abs=0.025)
    # the window noise floors the spread: seeds that agree exactly still leave the items' noise
    # derived: the same formula on the same floats (fp64 roundings only)
    assert stats.seed_mde(0.0, n, within_se=0.002) == pytest.approx(stats.seed_mde(0.002, n))
    assert math.isnan(stats.seed_mde(0.0, n)) and math.isnan(stats.seed_mde(0.01, 1))


def test_seeds_needed_for_a_band():
    # modded-nanogpt's record rule: seed sd 0.0013 nats, resolving 0.002 nats takes about 7 seeds per arm
    # there; paired on the same weights and batches, 6 seeds
    n = stats.seeds_needed(0.0013, 0.002)
    assert n == 6 and stats.seed_mde(0.0013, 6) <= 0.002 < stats.seed_mde(0.0013, 5)
    # the normal approximation ((z_a/2 + z_b) sigma / target)^2 for a large n
    big = stats.seeds_needed(0.01, 0.001)
    # derived: the t test needs about z^2 / 2 = 2 seeds more than the normal 785, and the ceiling < 1: 0.4%; 0.02 is 5x
    assert big == pytest.approx(((sps.norm.ppf(0.975) + sps.norm.ppf(0.8)) * 10) ** 2, rel=0.02)
    assert math.isnan(stats.seeds_needed(math.nan, 0.001)) and math.isnan(stats.seeds_needed(1.0, 1e-6, most=1000))


def test_within_se_by_hand():
    # derived: the same formula by hand (fp64 roundings only)
    assert stats.within_se([[0.0, 2.0], [1.0, 1.0, 4.0]]) == pytest.approx(math.sqrt((2.0 / 2 + 3.0 / 3) / 2))


def reference_snr(signal_scores, noise_scores):
    """allenai/signal-and-noise's snr/metrics.py signal_to_noise_ratio, as its docstring writes it:
    signal = max_jk |m_j - m_k| / mean(m); noise = sd(noise scores) / their mean."""
    signal_scores, noise_scores = np.asarray(signal_scores), np.asarray(noise_scores)
    dispersion = max(abs(a - b) for a in signal_scores for b in signal_scores)
    return (dispersion / signal_scores.mean()) / (noise_scores.std() / noise_scores.mean())


def test_task_snr_on_constructed_checkpoint_scores_matches_the_reference():
    # three models' last three checkpoints, each wobbling by the same +-0.02 around its mean
    scores = {"a": [0.50, 0.52, 0.48], "b": [0.60, 0.62, 0.58], "c": [0.55, 0.57, 0.53]}
    out = stats.task_snr(scores)
    sd = math.sqrt(2 * 0.02**2 / 3)
    # derived: each figure of task_snr by hand on the same floats (fp64 roundings only, here and below)
    assert out["signal"] == pytest.approx(0.10 / 0.55) and out["noise"] == pytest.approx(sd / 0.55)
    assert out["snr"] == pytest.approx(0.10 / sd)  # 6.1
    # the reference with one model's checkpoints as its noise (each model's are alike here, about the same mean)
    means = [np.mean(v) for v in scores.values()]
    assert out["snr"] == pytest.approx(reference_snr(means, np.array(scores["c"])))
    gaps = [0.10, 0.05, 0.05]
    assert out["decision_accuracy"] == pytest.approx(np.mean([sps.norm.cdf(g / (sd * math.sqrt(2))) for g in gaps]))
    assert out["can_rank"]
    # the same means under noise 5 times larger: SNR 1.2, decision accuracy near a coin flip's, cannot rank
    loud = {k: [np.mean(v) + 5 * (x - np.mean(v)) for x in v] for k, v in scores.items()}
    out = stats.task_snr(loud)
    assert out["snr"] == pytest.approx(0.10 / (5 * sd)) and out["snr"] < stats.RANK_Z and not out["can_rank"]
    assert 0.5 < out["decision_accuracy"] < 0.8
    assert math.isnan(stats.task_snr({"a": [0.5, 0.6]})["snr"]) and math.isnan(
        stats.task_snr({"a": [0.5], "b": [0.6]})["snr"]
    )
    zero = stats.task_snr({"a": [0.0, 0.0], "b": [0.0, 0.0]})  # a tiny model right on no item: no relative spread
    assert math.isnan(zero["snr"]) and not zero["can_rank"]
