"""The preflight: a micro run's checks pass on the real trainer with their figures, and each fault
(a stream cast behind the model's back, a budget below the projection, a resume that differs, a
full disk) fails its check in one line that names it, with no passed record left behind."""

import json

import pytest
import torch

from streamback import layout
from streamback.config import validate_config
from streamback.model.formats import StreamFormat
from streamback.model.model import ModelArgs, Transformer, count_params
from streamback.preflight import probe, stage
from streamback.train.trainer import Trainer

MODEL = {"shapes": {"micro": {"n_layers": 2, "dim": 32, "n_heads": 2, "n_kv_heads": 1, "multiple_of": 16}}, "max_seq_len": 64}
TRAIN = {
    "runs": {"shapes": ["micro"], "blocks": ["baseline", "streamback"], "streams": ["bf16_sr"], "seeds": [0, 1]},
    "tokens": 30 * 8 * 32, "seq_len": 32, "batch_size": 8, "micro_batch_size": 4,
    "optimizer": {"lr": 3e-3}, "schedule": {"warmup_steps": 1, "decay_steps": 8},
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
    assert by_name["resume"]["values"] == {"loss_diff": 0.0, "max_weight_diff": 0.0, "mean_weight_diff": 0.0}  # bitwise on the CPU
    losses = by_name["losses"]["values"]["losses"]
    assert len(losses) == 4 and losses[-1] < losses[0]
    speed = by_name["speed"]["values"]
    # the projection by hand: 30 steps of 8 x 32 tokens at the measured tokens/s, one process
    assert speed["projected_hours"] == pytest.approx(30 * 8 * 32 / speed["tokens_per_s"] / 3600)
    disk = by_name["disk"]["values"]
    with torch.device("meta"):
        params = count_params(Transformer(ModelArgs.from_config(validate_config({"model": MODEL})["model"], "micro", 300, block="streamback")))
    # the measured checkpoint (DCP's files and meta.json) is at least the 12 bytes a parameter estimated
    assert disk["checkpoint_bytes"] >= 12 * params and disk["needed_bytes"] == 3 * disk["checkpoint_bytes"] + 4 * params
    gaps = by_name["shadow"]["values"]["gaps"]
    assert len(gaps) == 3 and gaps[0] == 0 and max(gaps) < 1e-6  # an fp32 stream against its fp64 shadow
    assert not layout.preflight_scratch(out).exists() and not layout.preflight_failed_file(out).exists()


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
    assert f"projected {budget['projected_hours']:,.2f} CPU process-hours" in line and "train.budget_gpu_hours 0.00" in line


def test_a_resume_that_differs_fails(tokens, tmp_path, monkeypatch, capsys):
    """A load that loses AdamW's moments (the next step then starts them again) is not the uninterrupted step."""
    load = probe.load_checkpoint

    def forgetful(path, state):
        meta = load(path, state)
        state.optimizer.state.clear()
        return meta

    monkeypatch.setattr(probe, "load_checkpoint", forgetful)
    status, out = run_preflight(tokens, tmp_path)
    line = assert_refused(status, out, failed_lines(capsys), "resume")
    assert "(bound: bitwise equal (deterministic kernels))" in line and "weights by up to 0 " not in line


def test_a_full_disk_fails_before_training_starts(tokens, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(probe, "free_bytes", lambda path: 10_000)
    monkeypatch.setattr(Trainer, "_step", lambda *args: pytest.fail("a training step ran"))
    status, out = run_preflight(tokens, tmp_path)
    line = assert_refused(status, out, failed_lines(capsys), "disk")
    assert line.startswith("preflight micro-streamback: FAILED disk: FAIL: 0.00 GiB free under ") and str(tmp_path / "ckpt") in line
    assert [c["name"] for c in json.loads(layout.preflight_failed_file(out).read_text())["checks"]] == ["disk"]
