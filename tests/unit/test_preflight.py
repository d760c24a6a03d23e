"""The preflight: a micro run's checks pass on the real trainer with their figures, and each fault
(a stream cast behind the model's back, a budget below the projection, a resume that differs, a
full disk) fails its check in one line that names it, with no passed record left behind."""

import json

import pandas as pd
import pytest
import torch

from streamback import layout
from streamback.config import validate_config
from streamback.model import compute, execution
from streamback.model.formats import StreamFormat
from streamback.model.model import ModelArgs, Transformer, count_params
from streamback.preflight import probe, stage, table
from streamback.train.trainer import Trainer

# kernel-sensitive: CI runs these again with STREAMBACK_FORCE_NATIVE_BF16=1 (.ci/run)
pytestmark = pytest.mark.kernels

MODEL = {
    "shapes": {"micro": {"n_layers": 2, "dim": 32, "n_heads": 2, "n_kv_heads": 1, "multiple_of": 16}},
    "max_seq_len": 64,
}
TRAIN = {
    "runs": {"shapes": ["micro"], "blocks": ["baseline", "streamback"], "streams": ["bf16_sr"], "seeds": [0, 1]},
    "tokens": 30 * 8 * 32,
    "seq_len": 32,
    "batch_size": 8,
    "micro_batch_size": 4,
    "optimizer": {"lr": 3e-3},
    "schedule": {"warmup_steps": 1, "decay_steps": 8},
    "checkpoint": {"every": 5, "keep": 2},
    "log": {"every": 10, "stream_every": 4, "val_every": 10, "val_sequences": 16, "tensorboard": False},
    "preflight": {"steps": 5},
}


def run_preflight(tokens, root, arm="micro-streamback", **overrides):
    cfg = validate_config({"model": MODEL, "train": {**TRAIN, **overrides}})
    torch.set_num_threads(1)
    out = root / "preflight" / f"{arm}.json"
    status = stage.preflight(cfg["train"], cfg["model"], arm, arm, tokens, root / "ckpt", out, {"mem_mb": 4000})
    return status, out


def test_a_micro_run_passes_every_check_with_its_figures(tokens, tmp_path, capsys):
    status, out = run_preflight(tokens, tmp_path)
    assert status == 0, capsys.readouterr().err
    record = json.loads(out.read_text())
    by_name = {c["name"]: c for c in record["checks"]}
    assert list(by_name) == ["disk", "stream_dtype", "losses", "speed", "budget", "memory", "resume", "shadow"]
    assert record["passed"] and record["arm"] == record["run"] == "micro-streamback" and record["steps"] == 5
    assert record["software"]["torch"] == torch.__version__ and record["device"] and record["processes"] == 1
    dtype = by_name["stream_dtype"]["values"]
    assert dtype["forward"] == dtype["gradients"] == ["torch.float32"] * 3  # the embedding and both blocks' outputs
    assert by_name["resume"]["values"] == {
        "loss_diff": 0.0,
        "max_weight_diff": 0.0,
        "mean_weight_diff": 0.0,
    }  # bitwise on the CPU
    losses = by_name["losses"]["values"]["losses"]
    assert len(losses) == 4 and losses[-1] < losses[0]
    kernels = execution.decide(compute.mode()).kernels("cpu")  # this process's path, as summary.json names it
    assert record["kernels"] == dtype["kernels"] == by_name["speed"]["values"]["kernels"] == kernels
    assert by_name["stream_dtype"]["figure"].endswith(f"(on {kernels})")
    assert f"tokens/s on {kernels}: the run takes" in by_name["speed"]["figure"]
    speed = by_name["speed"]["values"]
    # the projection by hand: 30 steps of 8 x 32 tokens at the measured tokens/s, one process
    assert speed["projected_hours"] == pytest.approx(30 * 8 * 32 / speed["tokens_per_s"] / 3600)
    disk = by_name["disk"]["values"]
    with torch.device("meta"):
        params = count_params(
            Transformer(
                ModelArgs.from_config(validate_config({"model": MODEL})["model"], "micro", 300, block="streamback")
            )
        )
    # the measured checkpoint (DCP's files and meta.json) is at least the 12 bytes a parameter estimated
    assert disk["checkpoint_bytes"] >= 12 * params and disk["needed_bytes"] == 3 * disk["checkpoint_bytes"] + 4 * params
    gaps = by_name["shadow"]["values"]["gaps"]
    assert len(gaps) == 3 and gaps[0] == 0 and max(gaps) < 1e-6  # an fp32 stream against its fp64 shadow
    assert not layout.preflight_scratch(out).exists() and not layout.preflight_failed_file(out).exists()


@pytest.mark.parametrize("cpu_bf16", ["native", "emulated"])
def test_the_record_names_the_kernels_its_steps_ran_on_as_the_run_does(tokens, tmp_path, cpu_bf16):
    """The preflight runs on the execution its job decided (here `native` even on a CPU without
    native kernels, or `emulated`): its record and its stream_dtype and speed checks name that
    path, in the words of the run's summary.json (test_kernel_record.py)."""
    chosen = execution.decide(cpu_bf16, threads=1)
    with execution.applied(chosen):
        status, out = run_preflight(tokens, tmp_path)
    assert status == 0
    record = json.loads(out.read_text())
    by_name = {c["name"]: c for c in record["checks"]}
    assert (
        record["kernels"]
        == chosen.kernels()
        == ("bf16 on fp32 kernels on cpu" if cpu_bf16 == "emulated" else "native bf16 on cpu")
    )
    assert by_name["speed"]["values"]["kernels"] == by_name["stream_dtype"]["values"]["kernels"] == record["kernels"]


def failed_lines(capsys) -> list[str]:
    return [line for line in capsys.readouterr().err.splitlines() if line.startswith("preflight ")]


def assert_refused(status, out, lines, check):
    """Exit 1, no passed record, the failed one kept apart; one line, naming `check`, per failed check."""
    assert status == stage.EXIT_FAILED and not out.exists()
    record = json.loads(layout.preflight_failed_file(out).read_text())
    failed = [c["name"] for c in record["checks"] if c["status"] == "FAIL"]
    assert not record["passed"] and check in failed and len(lines) == len(failed)
    return next(line for line in lines if line.startswith(f"preflight micro-streamback: FAILED {check}: FAIL: "))


def test_a_stream_cast_to_bf16_behind_the_model_s_back_fails_naming_the_boundary(tokens, tmp_path, monkeypatch, capsys):
    add = StreamFormat.add
    monkeypatch.setattr(StreamFormat, "add", lambda self, h, delta: add(self, h, delta).bfloat16())
    status, out = run_preflight(tokens, tmp_path)
    line = assert_refused(status, out, failed_lines(capsys), "stream_dtype")
    assert "boundary 1 forward torch.bfloat16, boundary 2 forward torch.bfloat16" in line and "boundary 0" not in line
    assert line.endswith("(bound: torch.float32 at every boundary)")


def test_a_budget_below_the_projection_fails_naming_both(tokens, tmp_path, capsys):
    status, out = run_preflight(tokens, tmp_path, budget_gpu_hours=1e-7)
    line = assert_refused(status, out, failed_lines(capsys), "budget")
    record = json.loads(layout.preflight_failed_file(out).read_text())
    budget = next(c for c in record["checks"] if c["name"] == "budget")["values"]
    assert budget["projected_hours"] > budget["budget_hours"] == 1e-7
    assert (
        f"projected {budget['projected_hours']:,.2f} CPU process-hours" in line
        and "train.budget_gpu_hours 0.00" in line
    )


def test_a_resume_that_differs_fails(tokens, tmp_path, monkeypatch, capsys):
    """A load that loses AdamW's moments (the next step then starts them again) is not the uninterrupted step."""
    restore = Trainer.restore

    def forgetful(trainer, path):
        meta = restore(trainer, path)
        trainer.optimizer.state.clear()
        return meta

    monkeypatch.setattr(Trainer, "restore", forgetful)
    status, out = run_preflight(tokens, tmp_path)
    line = assert_refused(status, out, failed_lines(capsys), "resume")
    assert "(bound: bitwise equal (deterministic kernels))" in line and "weights by up to 0 " not in line


def test_a_full_disk_fails_before_training_starts(tokens, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(probe, "free_bytes", lambda path: 10_000)
    monkeypatch.setattr(Trainer, "_step", lambda *args: pytest.fail("a training step ran"))
    status, out = run_preflight(tokens, tmp_path)
    line = assert_refused(status, out, failed_lines(capsys), "disk")
    assert (
        line.startswith("preflight micro-streamback: FAILED disk: FAIL: 0.00 GiB free under ")
        and str(tmp_path / "ckpt") in line
    )
    assert [c["name"] for c in json.loads(layout.preflight_failed_file(out).read_text())["checks"]] == ["disk"]


# ---- the matrix's table --------------------------------------------------------------------


def hand_record(arm, tokens_per_s, hours):
    checks = [
        {
            "name": name,
            "status": "PASS",
            "values": {"tokens_per_s": tokens_per_s, "projected_hours": hours} if name == "speed" else {},
        }
        for name in table.CHECKS
    ]
    return {
        "arm": arm,
        "run": arm,
        "passed": True,
        "checks": checks,
        "device": "NVIDIA H200",
        "processes": 1,
        "unit": "GPU-hours",
        "created": "2026-12-02T00:00:00+00:00",
    }


def write_records(root):
    """Two arms of a matrix trained with two seeds each: micro-baseline 5 GPU-hours a run, micro-streamback 6."""
    paths = []
    for arm, hours in (("micro-baseline", 5.0), ("micro-streamback", 6.0)):
        path = root / f"{arm}.json"
        path.write_text(json.dumps(hand_record(arm, 1000.0, hours)))
        paths.append(str(path))
    return paths


@pytest.mark.parametrize(
    "extra, problem",
    [
        ({}, None),
        (
            {"budget_gpu_hours": 21.9},
            "budget: projected 22.00 GPU-hours for the matrix (bound: train.budget_gpu_hours 21.90)",
        ),
        (
            {"stated_gpu_hours": 14.0},
            "stated cost: projected 22.00 GPU-hours for the matrix (bound: 1.5 x the tiers table's 14.00, "
            "train.stated_gpu_hours)",
        ),
        ({"budget_gpu_hours": 22.0, "stated_gpu_hours": 14.7}, None),
    ],
)
def test_the_matrix_table_sums_the_arms_seeds_against_budget_and_stated_cost(tmp_path, capsys, extra, problem):
    from streamback.cli import main

    matrix = {"runs": {"shapes": ["micro"], "blocks": ["baseline", "streamback"], "seeds": [0, 1]}, "seed": 0, **extra}
    out = tmp_path / "preflights.csv"
    status = main(
        ["preflight-table", "--params", json.dumps(matrix), "--records", *write_records(tmp_path), "--out", str(out)]
    )
    err = capsys.readouterr()
    if problem is None:
        assert status == 0 and "projected 22.00 GPU-hours" in err.out  # (5 + 6) x 2 seeds
        rows = pd.read_csv(out).to_dict("records")
        assert [(r["arm"], r["runs"], r["run_hours"], r["arm_hours"], r["stream_dtype"]) for r in rows] == [
            ("micro-baseline", 2, 5.0, 10.0, "PASS"),
            ("micro-streamback", 2, 6.0, 12.0, "PASS"),
        ]
    else:
        assert status == table.EXIT_FAILED and not out.exists()
        assert err.err.splitlines() == [f"preflight matrix: FAILED {problem}"]


def test_the_page_shows_every_preflight(tmp_path, monkeypatch):
    from streamback.report.page import preflights

    monkeypatch.chdir(tmp_path)
    assert "rule preflight" in str(preflights()[0])  # not run yet: named, with its rule
    records = {p: json.loads(open(p).read()) for p in write_records(tmp_path)}
    matrix = validate_config(
        {
            "model": MODEL,
            "train": {"runs": {"shapes": ["micro"], "blocks": ["baseline", "streamback"], "seeds": [0, 1]}},
        }
    )["train"]
    layout.table(layout.PREFLIGHT_TABLE).parent.mkdir(parents=True)
    table.preflight_table(records, matrix).to_csv(layout.table(layout.PREFLIGHT_TABLE), index=False)
    shown, _, total = preflights()
    assert list(shown.arm) == ["micro-baseline", "micro-streamback"] and set(shown.resume) == {"PASS"}
    assert "22 GPU-hours for 4 runs" in str(total)


@pytest.mark.gpu
def test_the_preflight_of_a_compiled_shape_on_a_gpu(tokens, tmp_path):
    """`torchrun --standalone --nproc-per-node 1 -m streamback preflight` with compile on, as the
    rule launches it on one GPU: every check passes, on CUDA (the resume within its measured bound,
    the shadow's fp32 stream against the run's bf16 one), and the record names the GPU and CUDA."""
    import os
    import subprocess
    import sys

    import yaml

    from conftest import ROOT

    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump(validate_config({"model": MODEL, "train": {**TRAIN, "compile": True}})))
    out = tmp_path / "micro-baseline.json"
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node",
        "1",
        "-m",
        "streamback",
        "preflight",
        "--config",
        str(config),
        "--arm",
        "micro-baseline",
        "--data",
        str(tokens),
        "--checkpoints",
        str(tmp_path / "ckpt"),
        "--resources",
        json.dumps({"gpus": 1, "mem_mb": 64000}),
        "--out",
        str(out),
        "--threads",
        "1",
    ]
    proc = subprocess.run(cmd, env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    record = json.loads(out.read_text())
    by_name = {c["name"]: c for c in record["checks"]}
    assert (
        record["passed"]
        and record["unit"] == "GPU-hours"
        and "cuda" in record["software"]
        and record["device"] != "cpu"
    )
    assert by_name["stream_dtype"]["values"]["forward"] == ["torch.bfloat16"] * 3
    assert by_name["shadow"]["values"]["gaps"] is not None and by_name["memory"]["values"]["peak_bytes"] > 0
    print(json.dumps({name: c["figure"] for name, c in by_name.items()}, indent=1))  # the figures, for the device's log


def test_the_preflight_uses_only_the_trainer_s_public_names():
    """probe.py drives the run's own Trainer through its public API (train_step, save, restore,
    first_micro_batch, ...): no name with an underscore, read or set (issue 37)."""
    import ast
    import inspect

    tree = ast.parse(inspect.getsource(probe))
    trainers = {"trainer", "t"}  # self.trainer and its local alias
    reached = sorted(
        node.attr
        for node in ast.walk(tree)
        if isinstance(node, ast.Attribute)
        and node.attr.startswith("_")
        and (
            (isinstance(node.value, ast.Name) and node.value.id in trainers)
            or (isinstance(node.value, ast.Attribute) and node.value.attr == "trainer")
        )
    )
    assert reached == []
    public = {"train_step", "save", "restore", "first_micro_batch"}
    used = {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)}
    assert public <= used and all(callable(getattr(Trainer, name)) for name in public)
