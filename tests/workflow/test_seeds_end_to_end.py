"""The end-to-end half of test_seeds.py (commands run as processes, compiled or multi-process runs, Snakemake): the
same subjects, at the pace of whole runs."""

import pytest
import torch

from helpers.train import TRAIN, run_inprocess


@pytest.mark.slow
def test_a_micro_matrix_trains_two_seeds_paired(tokens, tmp_path):
    """Both blocks of two seeds, trained: each run's summary names its seed; within a seed the two
    blocks' first losses agree to their streams' rounding (the same weights and batch), across seeds
    they differ by more."""
    import json

    from streamback import layout
    from streamback.model.weights import read_model
    from streamback.train.metrics import read_metrics

    first = {}
    for run in ("micro-baseline", "micro-streamback", "micro-baseline-seed1", "micro-streamback-seed1"):
        assert run_inprocess(tokens, tmp_path / run, run=run, runs={**TRAIN["runs"], "seeds": [TRAIN["seed"], 1]}) == 0
        summary = json.loads((tmp_path / run / "out" / layout.SUMMARY_FILE).read_text())
        assert summary["run"] == run and summary["seed"] == (1 if run.endswith("seed1") else TRAIN["seed"])
        first[run] = read_metrics(tmp_path / run / "out" / layout.METRICS_FILE)[0]["loss"]
    within = max(
        abs(first["micro-baseline"] - first["micro-streamback"]),
        abs(first["micro-baseline-seed1"] - first["micro-streamback-seed1"]),
    )
    assert within < 1e-2, first
    across = [
        read_model(tmp_path / run / "out" / layout.MODEL_FILE).state
        for run in ("micro-baseline", "micro-baseline-seed1")
    ]
    assert not torch.equal(across[0]["output.weight"], across[1]["output.weight"])
