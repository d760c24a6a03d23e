"""The end-to-end half of test_preflight.py (commands run as processes, compiled or multi-process runs, Snakemake): the
same subjects, at the pace of whole runs."""

import json

import pytest

from streamback import layout
from streamback.config import validate_config

from helpers.preflight import MODEL, TRAIN


@pytest.mark.slow
def test_two_processes_under_torchrun_shard_the_model_and_pass(tokens, tmp_path):
    """The launcher of a two-process CPU run (torchrun, FSDP2 on gloo): the checks hold for the sharded model (the
    resume compares every rank's shard, the memory is the larger rank's). Run by hand with --out and no --gate, from
    an empty directory: the gate lands beside the record, and nothing in the working directory."""
    import os
    import subprocess
    import sys

    import yaml

    from conftest import ROOT

    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump(validate_config({"model": MODEL, "train": TRAIN})))
    out = tmp_path / "micro-streamback.json"
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node",
        "2",
        "-m",
        "streamback",
        "preflight",
        "--config",
        str(config),
        "--arm",
        "micro-streamback",
        "--data",
        str(tokens),
        "--checkpoints",
        str(tmp_path / "ckpt"),
        "--resources",
        json.dumps({"gpus": 0, "processes": 2, "mem_mb": 4000}),
        "--out",
        str(out),
        "--threads",
        "1",
    ]
    cwd = tmp_path / "elsewhere"
    cwd.mkdir()
    proc = subprocess.run(
        cmd,
        cwd=cwd,
        env={**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (tmp_path / "micro-streamback.pass").read_text() == layout.PASSED and not list(cwd.iterdir())
    record = json.loads(out.read_text())
    by_name = {c["name"]: c for c in record["checks"]}
    assert record["passed"] and record["processes"] == 2 and record["resources"]["processes"] == 2
    assert by_name["stream_dtype"]["values"]["forward"] == ["torch.float32"] * 3  # FSDP2 casts no block input
    assert by_name["resume"]["values"]["max_weight_diff"] == 0.0
    assert by_name["memory"]["values"]["available_bytes"] == 2000 * 2**20  # the job's 4000 MB over its two processes
