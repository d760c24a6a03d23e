"""The preflight: a micro run's checks pass on the real trainer with their figures, and each fault
(a stream cast behind the model's back, a budget below the projection, a resume that differs, a
full disk) fails its check in one line that names it, with no passed record left behind."""

import itertools
import json
import math
import os

import pandas as pd
import pytest
import torch

from streamback import layout
from streamback.config import validate_config
from streamback.model import compute, execution
from streamback.model.formats import StreamFormat
from streamback.model.model import ModelArgs, Transformer, count_params
from streamback.preflight import checks, probe, stage, table
from streamback.train.trainer import Trainer

from helpers.preflight import MODEL, TRAIN

# kernel-sensitive: CI runs these again on the other kernel path (.ci/run)
pytestmark = pytest.mark.kernels


def run_preflight(tokens, root, arm="micro-streamback", **overrides):
    cfg = validate_config({"model": MODEL, "train": {**TRAIN, **overrides}})
    torch.set_num_threads(1)
    out = root / "preflight" / f"{arm}.json"
    gate = out.with_suffix(".pass")
    status = stage.preflight(cfg["train"], cfg["model"], arm, arm, tokens, root / "ckpt", out, {"mem_mb": 4000}, gate)
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
    resume = by_name["resume"]["values"]
    timed = {key: resume.pop(key) for key in ("save_s", "step_s")}  # the train job's signal lead (jobs.signal_lead)
    assert resume == {"loss_diff": 0.0, "max_weight_diff": 0.0, "mean_weight_diff": 0.0}  # bitwise on the CPU
    # the slowest step is no faster than the speed check's median step (the same records' tokens over seconds)
    median_step_s = 8 * 32 / by_name["speed"]["values"]["tokens_per_s"]  # a batch of 8 windows of 32
    assert 0 < timed["save_s"] and median_step_s <= timed["step_s"] * (1 + 1e-9)  # 1e-9: the float division's rounding
    losses = by_name["losses"]["values"]
    assert len(losses["losses"]) == 4 and all(math.isfinite(v) for v in losses["losses"])
    before = losses["before"]  # one micro-batch of 4 windows of 32 next-token targets
    # derived: the same formula on the same floats (pytest.approx's default 1e-6 relative: a few fp64 roundings)
    assert before["tokens"] == 4 * 32 and losses["threshold"] == pytest.approx(2 * before["sd"] / math.sqrt(128))
    assert losses["drop"] == pytest.approx(before["mean"] - losses["after"]) and losses["drop"] > losses["threshold"]
    assert 1 <= losses["steps_taken"] <= checks.LEARN_STEPS and losses["lr"] == 3e-3
    kernels = execution.decide(compute.mode()).kernels("cpu")  # this process's path, as summary.json names it
    assert record["kernels"] == dtype["kernels"] == by_name["speed"]["values"]["kernels"] == kernels
    assert by_name["stream_dtype"]["figure"].endswith(f"(on {kernels})")
    assert f"tokens/s on {kernels}: the run takes" in by_name["speed"]["figure"]
    speed = by_name["speed"]["values"]
    # the projection by hand: 30 steps of 8 x 32 tokens at the measured tokens/s, one process
    # derived: the same product by hand (approx's 1e-6 relative holds any order of fp64 operations)
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
    assert by_name["shadow"]["values"]["bounds"][0] == checks.SHADOW_FP32_GAP  # the floor: fp32 rounds by 6e-8
    # derived: 81 x 2e-7 by hand against shadow_floor's own product (one fp64 rounding)
    assert [checks.shadow_floor(b) for b in (0, 2, 40)] == [1e-6, 1e-6, pytest.approx(81 * 2e-7)]
    assert not layout.preflight_scratch(out).exists() and not layout.preflight_failed_file(out).exists()
    assert out.with_suffix(".pass").read_text() == layout.PASSED  # the verdict the train jobs wait for


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


def test_the_speed_is_the_median_of_the_trainer_s_own_records_over_the_timed_steps(tokens, tmp_path):
    """The preflight's tokens/s is the run's metrics.jsonl figure: each step's `tokens_per_s` is
    the record `Trainer.train_step` returns (the step's tokens over its seconds, which `elapsed_s`
    adds up), and the figure is their median over the steps after the two that warm up, the
    `log.stream_every` steps among them as the run takes them (issue 37)."""
    from streamback.runs import run_matrix
    from streamback.train.processes import Distributed

    cfg = validate_config({"model": MODEL, "train": {**TRAIN, "preflight": {"steps": 14}}})["train"]
    torch.set_num_threads(1)
    env = Distributed.start()
    spec = next(s for s in run_matrix(cfg).values() if s.arm == "micro-streamback")
    preflight = probe.Preflight(
        spec, cfg, validate_config({"model": MODEL})["model"], tokens, tmp_path / "ckpt", tmp_path / "scratch", env,
        4000, 1,
    )  # fmt: skip
    speed = next(c for c in preflight.run() if c.name == "speed")
    records = preflight.records
    assert [r["step"] for r in records] == list(range(1, 14))  # the run's steps 1..13; step 14 is run twice
    assert [r["step"] for r in records if "stream_absmax" in r] == [4, 8, 12]  # stream_every 4, as the run
    # by hand: a step's seconds are what it added to elapsed_s, its tokens 8 windows of 32
    elapsed = [0.0] + [r["elapsed_s"] for r in records]
    by_hand = [8 * 32 / (b - a) for a, b in itertools.pairwise(elapsed)]
    # derived: by_hand repeats the trainer's division on the logged stamps (JSON round-trips fp64): what is left is the
    # fp64 rounding of cumulative seconds, ~1e-13 relative
    assert [r["tokens_per_s"] for r in records] == pytest.approx(by_hand, rel=1e-6)
    timed = sorted(by_hand[2:])  # steps 3..13: 11 of them, after the two that warm up
    # derived: the same division as by_hand's (fp64 rounding only, ~1e-13 relative)
    assert speed.values["timed_steps"] == 11 and speed.values["tokens_per_s"] == pytest.approx(timed[5], rel=1e-6)
    assert speed.values["tokens_per_s"] == probe.timed_tokens_per_s(records)[0]
    assert "(the median of 11 timed steps)" in speed.figure


def failed_lines(capsys) -> list[str]:
    return [line for line in capsys.readouterr().err.splitlines() if line.startswith("preflight ")]


def assert_refused(status, out, lines, check):
    """Exit 1, no passed record, the failed one kept apart; one line, naming `check`, per failed check."""
    assert status == stage.EXIT_FAILED and not out.exists() and not out.with_suffix(".pass").exists()
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


def test_a_bf16_stream_rounded_to_fp8_behind_its_name_fails_the_shadow_naming_the_boundary(
    tokens, tmp_path, monkeypatch, capsys
):
    """A stream that holds bf16 tensors (the dtype check passes) but rounds every sum to fp8 E4M3's
    grid: its gap to the fp64 shadow passes what bf16's rounding can give at the first boundaries."""
    from streamback.model.rounding import FP8_E4M3, round_to

    add = StreamFormat.add

    def coarse(self, h, delta):
        out = add(self, h, delta)
        return round_to(out.float(), FP8_E4M3).to(out.dtype) if self.name == "bf16" else out

    monkeypatch.setattr(StreamFormat, "add", coarse)
    status, out = run_preflight(tokens, tmp_path, arm="micro-baseline")
    line = next(line for line in failed_lines(capsys) if "FAILED shadow" in line)
    assert status == stage.EXIT_FAILED and "over its bound at boundaries [1" in line
    assert "(bound: gap " in line and "at boundary 1 (rounding to bf16 alone over 3 roundings), finite)" in line


def test_a_model_whose_gradients_are_zeroed_fails_the_loss_check(tokens, tmp_path, monkeypatch, capsys):
    """Every parameter's gradient zeroed as it is made: the steps run and their losses are finite, but
    the fixed batch's loss does not fall (AdamW's decay alone moves it by far less than its noise)."""

    class Frozen(Trainer):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            for p in self.params:
                p.register_hook(torch.zeros_like)

    monkeypatch.setattr(probe, "Trainer", Frozen)
    status, out = run_preflight(tokens, tmp_path)
    line = assert_refused(status, out, failed_lines(capsys), "losses")
    record = json.loads(layout.preflight_failed_file(out).read_text())
    losses = next(c for c in record["checks"] if c["name"] == "losses")["values"]
    assert losses["steps_taken"] == checks.LEARN_STEPS and abs(losses["drop"]) < losses["threshold"] / 10
    assert f"over {checks.LEARN_STEPS} steps on it at lr 0.003" in line and "standard errors" in line


# the default study's three tiny shapes, and the paper's depth at the smallest of their widths
TINY = {
    "tiny-skinny-tall": {"n_layers": 8, "dim": 64, "n_heads": 4, "n_kv_heads": 1, "multiple_of": 32},
    "tiny-medium": {"n_layers": 4, "dim": 96, "n_heads": 4, "n_kv_heads": 1, "multiple_of": 32},
    "tiny-fat-short": {"n_layers": 2, "dim": 128, "n_heads": 4, "n_kv_heads": 1, "multiple_of": 32},
    "deep": {"n_layers": 80, "dim": 32, "n_heads": 2, "n_kv_heads": 1, "multiple_of": 16},
}
# the paper's recipe: lr 4e-4, a 2,500-step warmup and decay (its steps' lr is at most 8e-7 by step 5)
PAPER_RECIPE = {
    "optimizer": {"lr": 4e-4},
    "schedule": {"warmup_steps": 2500, "decay_steps": 2500},
    "tokens": 5000 * 8 * 32,
    "repeat_data": True,
}


@pytest.mark.parametrize(
    "arm, recipe",
    [
        ("tiny-skinny-tall-baseline", PAPER_RECIPE),
        ("tiny-medium-baseline", PAPER_RECIPE),
        ("tiny-fat-short-baseline", PAPER_RECIPE),
        ("deep-baseline", {}),
        ("deep-streamback", {}),
    ],
)
def test_healthy_runs_pass_under_the_paper_s_recipe_and_at_its_depth(tokens, tmp_path, capsys, arm, recipe):
    """The paper's recipe (no learning in its first steps' losses) and 80 layers (a bf16 gap to the
    shadow that grows with depth, as the paper measures): every check passes; the 80-layer bf16
    gap is a measurement within rounding's bound, reported with its profile."""
    cfg = validate_config(
        {
            "model": {**MODEL, "shapes": TINY},
            "train": {
                **TRAIN,
                **recipe,
                "runs": {"shapes": list(TINY), "blocks": ["baseline", "streamback"], "seeds": [0]},
            },
        }
    )
    torch.set_num_threads(1)
    out = tmp_path / f"{arm}.json"
    status = stage.preflight(cfg["train"], cfg["model"], arm, arm, tokens, tmp_path / "ckpt", out, {"mem_mb": 4000})
    assert status == 0, capsys.readouterr().err
    by_name = {c["name"]: c["values"] for c in json.loads(out.read_text())["checks"]}
    shadow = by_name["shadow"]
    assert all(g <= b for g, b in zip(shadow["gaps"], shadow["bounds"]))
    if arm == "deep-baseline":  # the gap, in grid steps, grows with depth: within rounding's bound, which grows too
        steps, bounds = shadow["grid_steps"], shadow["bounds"]
        assert len(steps) == 81 and max(steps[60:]) > 2 * max(steps[:10]) and bounds[80] > 10 * bounds[1]


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
            "budget: projected 22.00 GPU-hours for the matrix (bound: train.budget_gpu_hours 21.90); the costliest "
            "arm: micro-streamback, 12.00 GPU-hours (2 runs)",
        ),
        (
            {"stated_gpu_hours": 14.0},
            "stated cost: projected 22.00 GPU-hours for the matrix (bound: 1.5 x the tiers table's 14.00, "
            "train.stated_gpu_hours); the costliest arm: micro-streamback, 12.00 GPU-hours (2 runs)",
        ),
        ({"budget_gpu_hours": 22.0, "stated_gpu_hours": 14.7}, None),
    ],
)
def test_the_matrix_table_sums_the_arms_seeds_against_budget_and_stated_cost(tmp_path, capsys, extra, problem):
    from streamback.cli import main

    matrix = {"runs": {"shapes": ["micro"], "blocks": ["baseline", "streamback"], "seeds": [0, 1]}, "seed": 0, **extra}
    out, gate = tmp_path / "preflights.csv", tmp_path / "matrix.pass"
    gate.write_text(layout.PASSED)  # an earlier verdict
    written = gate.stat().st_mtime_ns
    os.utime(gate, ns=(written - 10**9, written - 10**9))
    status = main(
        ["preflight-table", "--params", json.dumps(matrix), "--records", *write_records(tmp_path), "--out", str(out)]
        + ["--gate", str(gate)]
    )
    err = capsys.readouterr()
    if problem is None:
        assert status == 0 and "projected 22.00 GPU-hours" in err.out  # (5 + 6) x 2 seeds
        # the verdict is unchanged, so the gate is not rewritten (its mtime stays)
        assert gate.read_text() == "passed\n" and gate.stat().st_mtime_ns == written - 10**9
        rows = pd.read_csv(out).to_dict("records")
        assert [(r["arm"], r["runs"], r["run_hours"], r["arm_hours"], r["stream_dtype"]) for r in rows] == [
            ("micro-baseline", 2, 5.0, 10.0, "PASS"),
            ("micro-streamback", 2, 6.0, 12.0, "PASS"),
        ]
    else:
        assert status == table.EXIT_FAILED and not out.exists() and not gate.exists()  # no train job can start
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


def test_the_preflight_hashes_only_the_shards_its_steps_read(tokens, tmp_path, capsys, monkeypatch):
    """A shard that none of the preflight's steps reads is not hashed (a changed one goes unseen
    here; the run itself hashes every shard), and one that they read is checked when first read."""
    import shutil

    from streamback.data import shards
    from streamback.errors import StreambackError

    data = tmp_path / "tokens"
    shutil.copytree(tokens, data)
    monkeypatch.setattr(shards, "_VERIFIED", {})
    status, _ = run_preflight(data, tmp_path / "first")
    assert status == 0, capsys.readouterr().err
    assert "is checked against manifest.json (sha256, vocabulary) when its tokens are first read" in (
        capsys.readouterr().err
    )
    every = sorted(str(p.resolve()) for p in data.glob("*.bin"))
    read = sorted(k for k in shards._VERIFIED if k.startswith(str(data.resolve())))
    assert read and set(read) < set(every), (read, every)  # some shards read, not all
    unread = min(set(every) - set(read))
    with open(unread, "r+b") as f:  # one token id changed, past the header: its sha256 no longer matches
        f.seek(shards.HEADER_BYTES + 2)
        byte = f.read(1)
        f.seek(-1, os.SEEK_CUR)
        f.write(bytes([byte[0] ^ 1]))
    monkeypatch.setattr(shards, "_VERIFIED", {})
    status, _ = run_preflight(data, tmp_path / "second")
    assert status == 0, capsys.readouterr().err
    assert unread not in shards._VERIFIED
    with open(read[0], "r+b") as f:
        f.seek(shards.HEADER_BYTES + 2)
        byte = f.read(1)
        f.seek(-1, os.SEEK_CUR)
        f.write(bytes([byte[0] ^ 1]))
    monkeypatch.setattr(shards, "_VERIFIED", {})
    with pytest.raises(StreambackError, match=rf"shard {read[0]}: the sha256 of its tokens"):
        run_preflight(data, tmp_path / "third")
