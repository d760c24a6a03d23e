"""The end-to-end half of test_drift.py (commands run as processes, compiled or multi-process runs, Snakemake): the same
subjects, at the pace of whole runs."""

import pytest

from streamback.drift.simulate import simulate

from helpers.drift import assert_same_simulation, config


@pytest.mark.slow
def test_compiled_step_gives_the_eager_bits():
    """torch.compile's fused kernel against the eager step: every path, stochastic rounding included
    (both take the same random bits), bit for bit, over a few chunks of steps."""
    cfg = config(coords=72, steps=45, settings=[{"mu": 0.2, "sigma": 0.5}, {"mu": 0.5, "sigma": 1.0}], seeds=[0, 5])
    compiled = simulate(cfg, compiled=True)
    assert compiled.compiled
    assert_same_simulation(compiled, simulate(cfg, compiled=False))
