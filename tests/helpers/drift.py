"""The drift simulation's shared pieces: a small config, the bit-for-bit comparison of two simulations, the note's
findings."""

import math

import pandas as pd
import torch

from streamback.drift.simulate import PATHS

ALL_PATHS = list(PATHS)


def config(**changes):
    cfg = dict(
        coords=64,
        start=600.0,
        steps=200,
        settings=[{"mu": 0.2, "sigma": 0.5}],
        seeds=[0],
        paths=ALL_PATHS,
        trajectory_every=10,
    )
    return cfg | changes


def assert_same_simulation(a, b):
    """Two simulations agree bit for bit: paths, final values and trajectories."""
    assert a.paths == b.paths and a.steps_recorded == b.steps_recorded
    for path in a.paths:
        assert torch.equal(a.final[path], b.final[path]), path
    assert torch.equal(a.traj_mean, b.traj_mean) and torch.equal(a.traj_std, b.traj_std)


# bf16 (round to nearest) keeps this fraction of the fp32 drift in the note: (low, high) bands
# around 0.3%, 43% and 21% wide enough for 256 coordinates x 2 seeds (seed noise is far smaller).
NOTE_BF16_RATIO = {(0.2, 0.5): (0.002, 0.0045), (0.2, 1.0): (0.40, 0.47), (0.5, 1.0): (0.195, 0.23)}


def assert_note_findings(summary: pd.DataFrame) -> None:
    """The drift note's findings, within seed noise, on a drift summary table."""
    mean = summary.groupby(["mu", "sigma", "path"]).mean(numeric_only=True)
    n = summary.coords.iloc[0] * summary.seed.nunique()
    start = summary.start.iloc[0]
    for (mu, sigma), (low, high) in NOTE_BF16_RATIO.items():
        assert low < mean.loc[(mu, sigma, "bf16"), "drift_ratio"] < high, (mu, sigma)
        if "bf16_bf16_updates" in set(summary.path):
            # the baseline block's own add (bf16 updates into a bf16 sum), the note's "2.4 of 800": in the
            # same band, and never ahead of bf16 with fp32 updates, as an update just past the half gap
            # that rounds to the tie is lost too (common random numbers: the paths differ by such events only)
            assert low < mean.loc[(mu, sigma, "bf16_bf16_updates"), "drift_ratio"] < high, (mu, sigma)
            assert mean.loc[(mu, sigma, "bf16_bf16_updates"), "drift"] <= mean.loc[(mu, sigma, "bf16"), "drift"]
        # bf16-rounded updates into an fp32 sum cost almost nothing
        assert abs(mean.loc[(mu, sigma, "fp32_bf16_updates"), "drift_ratio"] - 1) < 1e-3
        # stochastic rounding recovers the fp32 drift, within its own added noise
        sr, ref = mean.loc[(mu, sigma, "bf16_sr")], mean.loc[(mu, sigma, "fp32")]
        standard_error = math.sqrt(max(sr.drift_std**2 - ref.drift_std**2, 0.0) / n)
        assert abs(sr.drift - ref.drift) < 5 * standard_error, (mu, sigma, sr.drift, ref.drift)
    # at (0.5, 1.0) the bf16 sum freezes just past 1024, where the gap doubles to 8
    assert 1024 <= start + mean.loc[(0.5, 1.0, "bf16"), "drift"] < 1040
