"""The end-to-end half of test_compute.py (commands run as processes, compiled or multi-process runs, Snakemake): the
same subjects, at the pace of whole runs."""

import os
import subprocess
import sys

import pytest
import torch

from streamback.model import compute

from conftest import ROOT
from helpers.data import windows
from helpers.train import run_inprocess

# kernel-sensitive: CI runs these again on the other kernel path (.ci/run)
pytestmark = pytest.mark.kernels


def test_auto_takes_fp32_kernels_exactly_where_torch_has_no_native_bf16_matmul():
    """auto follows torch's own test (oneDNN's bf16 kernels, which ONEDNN_MAX_CPU_ISA caps); the
    environment variable chooses; a bad value names the variable; no device but the CPU is emulated."""
    code = (
        "from streamback.model import compute; print(compute.mode(), compute.emulated(), compute.path('cpu'), "
        "compute.path('meta'))"
    )

    def child(**env):
        out = subprocess.run(
            [sys.executable, "-c", code], env={**os.environ, **env}, cwd=ROOT, capture_output=True, text=True
        )
        return out.returncode, (out.stdout + out.stderr).strip().splitlines()[-1]

    # where CI runs it again with the switch on (.ci/run), auto takes native kernels on every CPU
    native = compute.cpu_has_native_bf16() or os.environ.get(compute.FORCE_NATIVE_ENV) == "1"
    assert child(STREAMBACK_CPU_BF16="auto") == (
        0,
        f"auto {not native} {'bf16 on fp32 kernels' if not native else 'native bf16'} native bf16",
    )
    assert child(STREAMBACK_CPU_BF16="auto", ONEDNN_MAX_CPU_ISA="AVX2", **{compute.FORCE_NATIVE_ENV: "0"}) == (
        0,
        "auto True bf16 on fp32 kernels native bf16",
    )
    assert child(STREAMBACK_CPU_BF16="auto", ONEDNN_MAX_CPU_ISA="AVX2", **{compute.FORCE_NATIVE_ENV: "1"}) == (
        0,
        "auto False native bf16 native bf16",
    )
    assert child(STREAMBACK_CPU_BF16="native", ONEDNN_MAX_CPU_ISA="AVX2") == (0, "native False native bf16 native bf16")
    assert child(STREAMBACK_CPU_BF16="emulated") == (0, "emulated True bf16 on fp32 kernels native bf16")
    status, line = child(STREAMBACK_CPU_BF16="fast")
    assert status != 0 and "STREAMBACK_CPU_BF16: 'fast' is not one of auto, native, emulated" in line
    with compute.use("emulated"):
        assert compute._on_fp32(torch.ones(2, dtype=torch.bfloat16)) and not compute._on_fp32(torch.ones(2))
        assert not compute._on_fp32(torch.ones(2, dtype=torch.bfloat16, device="meta"))  # only the CPU is emulated
        assert compute.path("cpu", torch.float32) == "float32"
    with pytest.raises(Exception, match="'nope' is not one of"):
        with compute.use("nope"):
            pass


@pytest.mark.slow
def test_a_short_run_trains_alike_on_both_paths_and_the_findings_hold(tokens, tmp_path):
    """The trainer on each path from the same weights and batches: the same loss curve to within
    rounding-order noise; then on both paths the study's findings on the trained pair: the bf16
    stream's layer error above the fp32 stream's, and the final loss difference of baseline and
    StreamBack, each path's inside the other's paired interval."""
    from streamback.analysis.precision import layer_error
    from streamback.data.shards import TokenDataset
    from streamback.model.weights import load_model, read_model
    from streamback.stats import paired_difference
    from streamback.train.batches import val_windows
    from streamback.train.metrics import read_metrics
    from streamback.train.validation import window_losses

    runs = ("micro-baseline", "micro-streamback")
    curves = {}
    for mode in ("native", "emulated"):
        with compute.use(mode):
            for run in runs:
                assert run_inprocess(tokens, tmp_path / mode / run, run=run) == 0
        curves[mode] = [
            r["loss"] for r in read_metrics(tmp_path / mode / runs[0] / "out" / "metrics.jsonl") if "loss" in r
        ]
    gap = max(abs(a - b) for a, b in zip(curves["native"], curves["emulated"]))
    assert len(curves["native"]) >= 30 and gap < 5e-3, gap  # measured 3e-4 (AVX512-BF16), 5e-4 (as AVX2)

    models = {run: tmp_path / "native" / run / "out" / "model.pt" for run in runs}
    val = TokenDataset(tokens, "val")
    batch = windows(tokens, 4, 32, seed=11)
    findings = {}
    for mode in ("native", "emulated"):
        with compute.use(mode):
            table = layer_error(read_model(models[runs[0]]), batch, "fp64", ["bf16", "fp32"])
            last = table[(table.kind == "activations") & (table.layer == table.layer.max())].set_index("variant")
            assert last.loc["fp32", "rel_error"] < last.loc["bf16", "rel_error"], mode
            losses = [
                window_losses(load_model(models[run]), val, val_windows(64, 16, 0, 1), 32, 8, "cpu").numpy()
                for run in runs
            ]
            findings[mode] = paired_difference(*losses, 0.95)
    for (mean, _, _), (_, low, high) in (
        (findings["native"], findings["emulated"]),
        (findings["emulated"], findings["native"]),
    ):
        assert low <= mean <= high, findings
