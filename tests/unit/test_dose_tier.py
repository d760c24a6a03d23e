"""config/dose.yaml, the dose tier: depth at fixed width (20 x 64 and 80 x 64), two doses of the
embedding's initial std (1 and the pilot's), the arms each shape and dose trains, the seeds they
share, and the large dose the pilot recorded in docs/measurements.md."""

import re

import pytest

from streamback.config import merge_config, read_config_file, validate_config
from streamback.model.model import ModelArgs
from streamback.runs import check_runs, comparisons, run_matrix, train_steps

from conftest import ROOT

CONFIG = ROOT / "config" / "dose.yaml"


@pytest.fixture(scope="module")
def tier():
    """The tier as Snakemake sees it: merged over config/config.yaml."""
    return validate_config(merge_config(read_config_file(ROOT / "config" / "config.yaml"), read_config_file(CONFIG)))


def _doses(tier):
    """shape -> (layers, width, dose) of the tier's trained shapes."""
    model = tier["model"]
    return {
        name: (s["n_layers"], s["dim"], s.get("embedding_init_std", model["embedding_init_std"]))
        for name, s in model["shapes"].items()
        if name in tier["train"]["runs"]["shapes"]
    }


def _large(tier) -> float:
    (large,) = {dose for _, _, dose in _doses(tier).values() if dose != 1.0}
    return large


def test_two_depths_at_one_width_and_two_doses(tier):
    doses = _doses(tier)
    large = _large(tier)
    assert sorted(doses.values()) == sorted((d, 64, s) for d in (20, 80) for s in (1.0, large))
    for name in doses:
        args = ModelArgs.from_config(tier["model"], name, 2048)
        assert args.embedding_init_std == doses[name][2]
    # only depth and dose differ: the same width, heads and SwiGLU hidden at both depths
    widths = {
        (a.dim, a.n_heads, a.n_kv_heads, a.ffn_hidden_dim)
        for a in (ModelArgs.from_config(tier["model"], n, 2048) for n in doses)
    }
    assert len(widths) == 1
    check_runs(tier["train"], tier["model"], tier["data"])  # every run can be built and trained


def test_the_arms_of_each_shape_and_dose_and_their_shared_seeds(tier):
    matrix = run_matrix(tier["train"])
    doses, large = _doses(tier), _large(tier)
    arms = {}
    for spec in matrix.values():
        arms.setdefault((doses[spec.shape][0], doses[spec.shape][2]), {}).setdefault(spec.stream, set()).add(spec.seed)
    seeds = set(tier["train"]["runs"]["seeds"])
    assert len(seeds) == 3
    assert {k: set(v) for k, v in arms.items()} == {
        (20, 1.0): {"bf16", "fp32"},
        (80, 1.0): {"bf16", "fp32", "mxfp8", "nvfp4"},
        (20, large): {"bf16", "fp32", "bf16_sr"},
        (80, large): {"bf16", "fp32", "bf16_sr"},
    }
    assert all(arm_seeds == seeds for streams in arms.values() for arm_seeds in streams.values())
    # every other arm is paired with its shape and dose's baseline, seed by seed
    pairs = comparisons(matrix)
    assert len(pairs) == len(matrix) - 4 * len(seeds)
    assert all(matrix[base].seed == matrix[other].seed and matrix[base].shape == shape for shape, base, other in pairs)


def test_the_large_dose_is_the_pilot_s(tier):
    """dose.yaml's large dose is the one benchmarks/pilot_dose.py chose, as docs/measurements.md records it."""
    measured = (ROOT / "docs" / "measurements.md").read_text()
    (chosen,) = re.findall(r"`PYTHONPATH=\. python benchmarks/pilot_dose\.py` .*chosen dose: \*\*(\d+)\*\*", measured)
    assert _large(tier) == float(chosen)


def test_the_tier_s_steps(tier):
    train = tier["train"]
    assert train_steps(train) == 200
    assert train["schedule"]["warmup_steps"] + train["schedule"]["decay_steps"] < train_steps(train)


def test_the_drift_study_runs_at_the_model_s_horizon_with_the_pilot_s_ratios(tier):
    """drift: 2L adds of the deeper shape, from h_0's rms, at the (mean, spread) over h_0's rms that the
    pilot measured at each dose (docs/measurements.md), in the order of the doses."""
    drift, measured = tier["drift"], (ROOT / "docs" / "measurements.md").read_text()
    assert drift["steps"] == 2 * max(layers for layers, _, _ in _doses(tier).values())
    assert drift["start"] == 1.0
    ratios = re.findall(r"dose (\d+) h_0 rms [\d.]+, mean update ([\d.]+) of it, spread ([\d.]+) of it", measured)
    assert [float(d) for d, _, _ in ratios] == [1.0, _large(tier)]
    assert [(s["mu"], s["sigma"]) for s in drift["settings"]] == [(float(m), float(s)) for _, m, s in ratios]
