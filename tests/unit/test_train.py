"""The trainer: schedule, batches, metrics log and checkpoints against hand-computed values; whole
runs for determinism, resume after SIGKILL and SIGTERM, divergence, bad input, and FSDP2 on two
gloo processes against one process; integrity: corrupt shards and checkpoints named and never
used (the previous good checkpoint resumes bit-identically), a second trainer refused, unwritable
directories and data budgets found before training. Runs use a micro model (2 layers x 32) on a
small synthetic corpus tokenized by the data stage."""

import hashlib
import json
import math
import os
import re
import shutil
import signal
import socket
import sys
import time

import numpy as np
import pytest
import torch

from streamback import layout
from streamback.config import DEFAULT_CONFIG, load_config, validate_config
from streamback.errors import StreambackError
from streamback.model.model import ModelArgs
from streamback.model.weights import read_model
from streamback.runs import check_runs, check_wsd, run_matrix
from streamback.train import checkpoint as ckpt
from streamback.train import runlock
from streamback.train import trainer as train_module
from streamback.train.batches import num_windows, permute, rank_micro_batches, train_windows, val_windows
from streamback.train.checkpoint import recipe_fingerprint
from streamback.train.checkpointing import recipe_identity
from streamback.train.metrics import MetricsLog, header_file, read_header, read_metrics
from streamback.train.parallel import StreamDtypeWatch
from streamback.train.schedule import wsd_lr

from helpers.train import (  # noqa: F401  (reference: the module's reference run, a fixture)
    STEPS,
    TRAIN,
    cli,
    config,
    deterministic,
    final_weights,
    linear_state,
    recipe_of,
    reference,
    run_inprocess,
)

# ---- pieces ---------------------------------------------------------------------------------


def test_wsd_values_at_the_phase_boundaries():
    lr, total, warmup, decay = 4e-4, 100, 10, 20
    values = {s: wsd_lr(s, lr, total, warmup, decay) for s in (0, 4, 9, 10, 79, 80, 90, 99, 100, 150)}
    # derived: the schedule's formula by hand (fp64 roundings only, within approx's 1e-6), here and below
    assert values[0] == pytest.approx(lr / 10)  # first update: lr / warmup, not zero
    assert values[4] == pytest.approx(lr * 5 / 10)
    assert (
        values[9] == values[10] == values[79] == values[80] == lr
    )  # peak from the last warmup step to the decay's start
    assert values[90] == pytest.approx(lr / 2)  # half way through the cosine
    assert values[99] == pytest.approx(lr * (1 + math.cos(math.pi * 19 / 20)) / 2)
    assert values[100] == values[150] == 0.0
    assert wsd_lr(5, lr, 10, 5, 0) == lr  # no decay phase
    check_wsd(30, 10, 20)
    with pytest.raises(StreambackError, match="warmup_steps"):
        check_wsd(29, 10, 20)


def test_batches_are_a_shuffle_of_every_window_per_epoch():
    for n in (1, 2, 3, 17, 1000, 4099):
        assert sorted(permute(np.arange(n), n, seed=5, epoch=2)) == list(range(n))
    n, batch = 50, 8
    assert num_windows(32 * n + 1, 32) == n and num_windows(32 * n, 32) == n - 1
    seen = np.concatenate([train_windows(3, s, batch, n) for s in range(25)])  # 200 = 4 epochs
    for epoch in range(4):
        assert sorted(seen[epoch * n : (epoch + 1) * n]) == list(range(n))
    assert not np.array_equal(seen[:n], seen[n : 2 * n])  # each epoch has its own order
    assert np.array_equal(train_windows(3, 7, batch, n), train_windows(3, 7, batch, n))
    assert not np.array_equal(train_windows(3, 7, batch, n), train_windows(4, 7, batch, n))


def test_ranks_split_the_global_batch_in_order():
    windows = np.arange(16)
    one = rank_micro_batches(windows, 0, 1, 4)
    two = rank_micro_batches(windows, 0, 2, 4) + rank_micro_batches(windows, 1, 2, 4)
    assert (
        [m.tolist() for m in one]
        == [m.tolist() for m in two]
        == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11], [12, 13, 14, 15]]
    )
    assert val_windows(10, 7, 0, 2).tolist() == [0, 1, 2] and val_windows(10, 7, 1, 2).tolist() == [3, 4, 5]
    assert val_windows(4, 100, 0, 1).tolist() == [0, 1, 2, 3]


def test_run_matrix_names():
    runs = run_matrix(config()["train"])
    assert list(runs) == ["micro-baseline", "micro-streamback", "micro-streamback-bf16_sr"]
    assert (runs["micro-streamback-bf16_sr"].block, runs["micro-streamback-bf16_sr"].stream) == (
        "streamback",
        "bf16_sr",
    )
    with pytest.raises(StreambackError, match="not in the matrix: nope"):
        run_matrix(config(per_run={"nope": {"micro_batch_size": 2}})["train"])
    two = {"shapes": ["a", "b"], "blocks": ["baseline", "streamback"], "streams": ["mxfp8", "nvfp4"]}
    only_b = run_matrix(validate_config({"train": {"runs": {**two, "stream_shapes": ["b"]}}})["train"])
    assert list(only_b) == [
        "a-baseline",
        "a-streamback",
        "b-baseline",
        "b-streamback",
        "b-streamback-mxfp8",
        "b-streamback-nvfp4",
    ]
    assert len(run_matrix(validate_config({"train": {"runs": two}})["train"])) == 8  # null: every shape
    with pytest.raises(StreambackError, match="stream_shapes names shapes that are not in train.runs.shapes: c"):
        run_matrix(validate_config({"train": {"runs": {**two, "stream_shapes": ["c"]}}})["train"])

    # a mapping gives each stream its own shapes (config/dose.yaml); the names are those of a list
    def matrix(stream_shapes):
        return run_matrix(validate_config({"train": {"runs": {**two, "stream_shapes": stream_shapes}}})["train"])

    each = matrix({"mxfp8": ["b"], "nvfp4": ["a", "b"]})
    assert list(each) == [
        "a-baseline",
        "a-streamback",
        "a-streamback-nvfp4",
        "b-baseline",
        "b-streamback",
        "b-streamback-mxfp8",
        "b-streamback-nvfp4",
    ]
    with pytest.raises(StreambackError, match="must name exactly the streams .*missing nvfp4; fp16 not in"):
        matrix({"mxfp8": ["b"], "fp16": ["a"]})
    with pytest.raises(StreambackError, match="not in train.runs.shapes: c"):
        matrix({"mxfp8": ["c"], "nvfp4": []})


def test_metrics_log_is_cut_back_to_the_checkpoint(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text("".join(json.dumps({"step": s, "loss": 1.0 / s}) + "\n" for s in range(1, 11)) + '{"step": 11, "lo')
    log = MetricsLog(path, resume_step=6)
    log.append({"step": 7, "loss": 0.5})
    log.close()
    assert [r["step"] for r in read_metrics(path)] == [1, 2, 3, 4, 5, 6, 7]
    path.write_text("".join(json.dumps({"step": s}) + "\n" for s in (1, 2, 4)))
    with pytest.raises(StreambackError, match="steps 1..4"):
        MetricsLog(path, resume_step=4)
    MetricsLog(path, resume_step=0).close()  # a fresh start empties the log
    assert path.read_text() == ""


def test_metrics_log_holds_steps_alone_and_its_header_lies_beside_it(tmp_path):
    """A log written when the header was its first line: read as before, and a resume moves the
    header into metrics.header.json, leaving one record per step."""
    path = tmp_path / "metrics.jsonl"
    old_header = {"kernels": "bf16 on fp32 kernels on cpu", "kernel_changes": []}
    path.write_text(
        json.dumps({"header": old_header}) + "\n" + "".join(json.dumps({"step": s}) + "\n" for s in (1, 2, 3))
    )
    assert (read_header(path), [r["step"] for r in read_metrics(path)]) == (old_header, [1, 2, 3])
    new_header = {**old_header, "kernel_changes": [{"step": 2, "from": "a", "to": "b"}]}
    log = MetricsLog(path, resume_step=2, header=new_header)
    log.append({"step": 3})
    log.close()
    assert [json.loads(line) for line in path.read_text().splitlines()] == [{"step": 1}, {"step": 2}, {"step": 3}]
    assert json.loads(header_file(path).read_text()) == read_header(path) == new_header
    assert header_file(path) == tmp_path / "metrics.header.json"
    header_file(path).write_text("{")
    with pytest.raises(StreambackError, match="metrics.header.json is not JSON"):
        read_header(path)


def test_checkpoints_are_atomic_and_pruned(tmp_path, monkeypatch):
    model, optimizer, state = linear_state(0)
    for step in (5, 10, 15):
        ckpt.save_checkpoint(tmp_path, step, state, {"tag": step}, keep=2)
    assert [s for s, _ in ckpt.list_checkpoints(tmp_path)] == [10, 15]

    def crash(state_dict, storage_writer):  # a crash in the middle of writing step 20
        (storage_writer.path / "__0_0.distcp").write_bytes(b"half")
        raise OSError("disk full")

    monkeypatch.setattr(ckpt.dcp, "save", crash)
    with pytest.raises(OSError):
        ckpt.save_checkpoint(tmp_path, 20, state, {}, keep=2)
    monkeypatch.undo()
    assert not (
        tmp_path / ".tmp_step_000000020"
    ).exists()  # a save that fails removes its partial directory (a killed one: remove_partial)
    assert [s for s, _ in ckpt.list_checkpoints(tmp_path)] == [10, 15]

    fresh_model, fresh_opt, fresh_state = linear_state(1)
    path = ckpt.checkpoint_dir(tmp_path, 15)
    meta = ckpt.load_newest(tmp_path, fresh_state)  # step 15, the newest
    assert (meta["tag"], meta["step"]) == (15, 15)
    files = sorted(p.name for p in path.iterdir() if p.name != "meta.json")
    assert files == [".metadata", "__0_0.distcp"] and sorted(meta["files"]) == files
    for name in files:  # recorded inside the atomic write, checked here against hashlib
        data = (path / name).read_bytes()
        assert meta["files"][name] == {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    assert torch.equal(fresh_model.weight, model.weight)
    for p, q in zip(model.parameters(), fresh_model.parameters()):
        assert torch.equal(optimizer.state[p]["exp_avg_sq"], fresh_opt.state[q]["exp_avg_sq"])


def test_a_wrapper_that_casts_the_stream_is_caught():
    from streamback.model.model import ModelArgs, Transformer

    model = Transformer(ModelArgs.from_config(config()["model"], "micro", 50, block="streamback"))
    model.layers[1].register_forward_pre_hook(
        lambda module, args: (args[0].bfloat16(), *args[1:])
    )  # what FSDP2's input cast does
    watch = StreamDtypeWatch(model)
    model(torch.zeros(1, 4, dtype=torch.long))
    with pytest.raises(RuntimeError, match=r"blocks \[1\] as torch.bfloat16, not torch.float32"):
        watch.check_and_remove()


# ---- whole runs -----------------------------------------------------------------------------


def test_run_outputs_and_same_seed_same_metrics(reference, tokens, tmp_path):
    records = reference["metrics"]
    assert [r["step"] for r in records] == list(range(1, STEPS + 1))
    assert records[-1]["tokens"] == STEPS * 8 * 32
    assert [r["step"] for r in records if "val_loss" in r] == [10, 20, 30]
    assert [r["step"] for r in records if "stream_absmax" in r] == [4, 8, 12, 16, 20, 24, 28]
    envelope = [records[3][k] for k in ("stream_absmax", "stream_max", "stream_min")]
    assert all(len(v) == 3 for v in envelope) and all(a == max(hi, -lo) and lo < 0 < hi for a, hi, lo in zip(*envelope))
    assert set(records[3]["norm_gain_absmax"]) == {
        "layers.0.attention_norm",
        "layers.0.ffn_norm",
        "layers.1.attention_norm",
        "layers.1.ffn_norm",
        "norm",
    }
    # derived: the schedule's formula by hand (fp64, then JSON's exact round trip)
    assert records[0]["lr"] == pytest.approx(3e-3 / 4)
    assert records[-1]["lr"] == pytest.approx(
        3e-3 * (1 + math.cos(math.pi * 7 / 8)) / 2
    )  # step 29 of 30, 7/8 into the decay
    assert records[-1]["val_loss"] < records[0]["loss"] - 1.0
    summary = json.loads((reference["root"] / "out" / layout.SUMMARY_FILE).read_text())
    assert (summary["steps"], summary["stream"], summary["final_val_loss"]) == (STEPS, "fp32", records[-1]["val_loss"])
    assert summary["embedding_init_std"] == 1.0  # the dose, beside the shape (TorchTitan's by default)
    saved = read_model(reference["root"] / "out" / layout.MODEL_FILE)
    assert (
        saved.args.block == "streamback"
        and saved.args.embedding_init_std == 1.0  # the model file carries the dose with the shape
        and saved.stream == "fp32"
        and all(v.dtype == torch.float32 for v in saved.state.values())
    )
    assert [s for s, _ in ckpt.list_checkpoints(recipe_of(reference["root"]))] == [25, 30]

    assert run_inprocess(tokens, tmp_path) == 0
    assert deterministic(read_metrics(tmp_path / "out" / layout.METRICS_FILE)) == deterministic(records)
    again = final_weights(tmp_path / "out" / layout.MODEL_FILE)
    assert all(torch.equal(again[k], reference["model"][k]) for k in reference["model"])


def test_a_stochastically_rounded_stream_resumes_exactly(tokens, tmp_path):
    """The random bits of stochastic rounding are a function of (seed, step, rank), like the batches."""
    run = "micro-streamback-bf16_sr"
    assert run_inprocess(tokens, tmp_path, run=run) == 0
    whole = final_weights(tmp_path / "out" / layout.MODEL_FILE)
    metrics = deterministic(read_metrics(tmp_path / "out" / layout.METRICS_FILE))
    shutil.rmtree(tmp_path / "out")
    shutil.rmtree(ckpt.checkpoint_dir(recipe_of(tmp_path), 30))  # as if killed after the checkpoint of step 25
    assert run_inprocess(tokens, tmp_path, run=run) == 0
    assert deterministic(read_metrics(tmp_path / "out" / layout.METRICS_FILE)) == metrics
    resumed = final_weights(tmp_path / "out" / layout.MODEL_FILE)
    assert all(torch.equal(resumed[k], whole[k]) for k in whole)
    assert json.loads((tmp_path / "out" / layout.SUMMARY_FILE).read_text())["stream"] == "bf16_sr"


def test_nan_loss_stops_and_keeps_the_last_good_checkpoint(tokens, tmp_path, monkeypatch, capsys):
    from streamback.model.model import Transformer

    calls = {"n": 0}
    real = Transformer.head_loss  # the training steps' loss (validation takes the logits)

    def poisoned(self, h, targets):
        calls["n"] += 1
        loss = real(self, h, targets)
        return loss * float("nan") if calls["n"] == 2 * 12 - 1 else loss  # first micro-batch of step 12

    monkeypatch.setattr(Transformer, "head_loss", poisoned)
    assert run_inprocess(tokens, tmp_path) == train_module.EXIT_DIVERGED
    err = capsys.readouterr().err
    assert "the training loss is nan at step 12" in err and "step_000000010 (step 10)" in err
    assert [s for s, _ in ckpt.list_checkpoints(recipe_of(tmp_path))] == [5, 10]
    assert [r["step"] for r in read_metrics(recipe_of(tmp_path) / "metrics.jsonl")] == list(range(1, 12))
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    "overrides, run, words",
    [
        ({"micro_batch_size": 3}, "micro-streamback", "multiple of micro_batch_size (3)"),
        ({}, "micro-nope", "not in the train.runs matrix"),
        ({"schedule": {"warmup_steps": 20, "decay_steps": 20}}, "micro-streamback", "exceed the run's 30 steps"),
        ({"seq_len": 128, "tokens": STEPS * 8 * 128}, "micro-streamback", "exceeds model.max_seq_len"),
    ],
)
def test_bad_settings_stop_before_training(tokens, tmp_path, overrides, run, words):
    with pytest.raises(StreambackError, match=words.replace("(", r"\(").replace(")", r"\)")):
        run_inprocess(tokens, tmp_path, run=run, **overrides)
    assert not (tmp_path / "ckpt").exists()


# ---- integrity --------------------------------------------------------------------------------


def flip_bit(path, offset):
    data = bytearray(path.read_bytes())
    data[offset] ^= 1
    path.write_bytes(bytes(data))


def _edit_meta(path):
    meta = json.loads(path.read_text())
    meta["elapsed_s"] += 1.0  # a plausible value, valid JSON: only the seal tells
    path.write_text(json.dumps(meta))


@pytest.mark.parametrize(
    "damage, problem",
    [
        (
            lambda d: flip_bit(d / "__0_0.distcp", 5000),
            "the sha256 of __0_0.distcp differs from the one meta.json recorded",
        ),
        (
            lambda d: (d / "__0_0.distcp").write_bytes((d / "__0_0.distcp").read_bytes()[:-100]),
            r"__0_0.distcp is [\d,]+ bytes, meta.json records",
        ),
        (lambda d: (d / ".metadata").unlink(), ".metadata is missing"),
        (lambda d: _edit_meta(d / "meta.json"), "meta.json does not match its own sha256"),
        (lambda d: (d / "meta.json").write_text('{"step": 3'), "meta.json is not valid JSON"),
    ],
)
def test_a_corrupt_checkpoint_is_named_and_the_previous_one_resumes_exactly(
    reference, tokens, tmp_path, capsys, damage, problem
):
    shutil.copytree(reference["root"] / "ckpt", tmp_path / "ckpt")
    newest = ckpt.checkpoint_dir(recipe_of(tmp_path), 30)
    damage(newest)
    assert run_inprocess(tokens, tmp_path) == 0
    err = capsys.readouterr().err
    aside = recipe_of(tmp_path) / "corrupt-step_000000030"
    assert re.search(
        rf"checkpoint {newest}: {problem}.*; moved aside to {aside}, resuming from .*step_000000025 instead", err
    ), err
    assert "resuming from step 25" in err and aside.is_dir()
    model = final_weights(tmp_path / "out" / layout.MODEL_FILE)
    assert all(torch.equal(model[k], reference["model"][k]) for k in model)  # steps 26-30 redone: the same bits
    assert deterministic(read_metrics(tmp_path / "out" / layout.METRICS_FILE)) == deterministic(reference["metrics"])
    assert [s for s, _ in ckpt.list_checkpoints(recipe_of(tmp_path))] == [25, 30]


def test_when_no_checkpoint_passes_the_run_stops_and_moves_nothing(reference, tokens, tmp_path):
    shutil.copytree(reference["root"] / "ckpt", tmp_path / "ckpt")
    for step in (25, 30):
        flip_bit(ckpt.checkpoint_dir(recipe_of(tmp_path), step) / "__0_0.distcp", 7000)
    with pytest.raises(StreambackError) as err:
        run_inprocess(tokens, tmp_path)
    assert "no checkpoint in" in str(err.value) and "delete" in str(err.value)
    assert "step_000000030: the sha256 of __0_0.distcp" in str(
        err.value
    ) and "step_000000025: the sha256 of __0_0.distcp" in str(err.value)
    assert [s for s, _ in ckpt.list_checkpoints(recipe_of(tmp_path))] == [25, 30] and not (tmp_path / "out").exists()


def test_a_corrupt_shard_stops_the_run_before_training(tokens, tmp_path):
    data = tmp_path / "tokens"
    shutil.copytree(tokens, data)
    flip_bit(data / "train-00001.bin", 1024 + 20)
    with pytest.raises(
        StreambackError, match=r"shard .*train-00001\.bin: the sha256 of its tokens is .*manifest\.json records"
    ):
        run_inprocess(data, tmp_path)
    assert not layout.recipe_dirs(tmp_path / "ckpt") and not (tmp_path / "ckpt" / layout.VERIFIED_SHARDS).exists()


def test_verified_shards_are_recorded_and_a_changed_one_is_hashed_again(tokens, tmp_path, capsys, monkeypatch):
    from streamback.data import shards

    data = tmp_path / "tokens"
    shutil.copytree(tokens, data)
    overrides = {"tokens": 5 * 8 * 32, "schedule": {"warmup_steps": 1, "decay_steps": 1}}
    assert run_inprocess(data, tmp_path, **overrides) == 0
    n = len(list(data.glob("*.bin")))
    assert f"hashed {n} (" in capsys.readouterr().err
    record = shards.read_record(tmp_path / "ckpt" / layout.VERIFIED_SHARDS)
    assert sorted(record) == sorted(str(p.resolve()) for p in data.glob("*.bin"))
    monkeypatch.setattr(shards, "_VERIFIED", {})  # a new process
    shutil.rmtree(tmp_path / "out")
    assert run_inprocess(data, tmp_path, **overrides) == 0
    err = capsys.readouterr().err
    assert "hashed 0 (0.0 MB)" in err and f"; {n} unchanged since this run verified them" in err
    monkeypatch.setattr(shards, "_VERIFIED", {})
    flip_bit(data / "val-00000.bin", 1024 + 2)
    shutil.rmtree(tmp_path / "out")
    with pytest.raises(StreambackError, match=r"val-00000\.bin: the sha256"):
        run_inprocess(data, tmp_path, **overrides)


def test_a_stop_signal_during_the_setup_stops_the_run_after_one_step_with_its_checkpoint(
    tokens, tmp_path, monkeypatch, capsys
):
    """Slurm's SIGURG (the lead before a time limit) while the trainer still sets up (here: as
    it builds the model) is heard, not fatal: the run takes one step, saves it and exits 75."""
    build = train_module.Trainer._build_model

    def signalled(self):
        os.kill(os.getpid(), signal.SIGURG)
        return build(self)

    monkeypatch.setattr(train_module.Trainer, "_build_model", signalled)
    assert run_inprocess(tokens, tmp_path) == train_module.EXIT_REQUEUE
    assert "SIGURG received: saved the checkpoint of step 1; exiting with status 75" in capsys.readouterr().err
    assert [step for step, _ in ckpt.list_checkpoints(recipe_of(tmp_path))] == [1]
    assert signal.getsignal(signal.SIGURG) == signal.SIG_DFL  # given back


def test_a_second_trainer_on_the_run_is_refused_naming_the_first(tokens, tmp_path):
    (tmp_path / "ckpt").mkdir()
    ready, told = os.pipe()
    holder = os.fork()
    if holder == 0:  # the first trainer, as far as the lock goes
        try:
            handle = runlock.lock_run(tmp_path / "ckpt")
            os.write(told, b"locked")
            time.sleep(120)
        finally:
            os._exit(0)
    try:
        assert os.read(ready, 6) == b"locked"
        with pytest.raises(
            StreambackError,
            match=rf"another trainer is training this run: .*trainer.lock is held by PID {holder} "
            rf"on host {socket.gethostname()} \(since .*\) \(its flock is held\)",
        ):
            run_inprocess(tokens, tmp_path)
        assert not layout.recipe_dirs(tmp_path / "ckpt")
    finally:
        os.kill(holder, signal.SIGKILL)  # no chance to clean up: its lock file stays, its PID is gone
        os.waitpid(holder, 0)
    handle = runlock.lock_run(tmp_path / "ckpt")
    assert f'"pid": {os.getpid()}' in (tmp_path / "ckpt" / layout.TRAINER_LOCK).read_text()
    handle.close()


def test_unwritable_directories_are_found_before_training(tokens, tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    cfg = config()
    with pytest.raises(StreambackError, match=rf"output directory {blocker}/out is not writable \(Not a directory\)"):
        train_module.train(cfg["train"], cfg["model"], "micro-streamback", tokens, blocker / "out", tmp_path / "ckpt")
    assert not layout.recipe_dirs(tmp_path / "ckpt")
    with pytest.raises(StreambackError, match=rf"checkpoint directory {blocker}/ckpt is not writable"):
        train_module.train(cfg["train"], cfg["model"], "micro-streamback", tokens, tmp_path / "out", blocker / "ckpt")
    assert not (tmp_path / "out").exists()


def test_threads_and_the_status_file_on_the_command_line(tmp_path, capsys):
    from streamback.cli import main

    status = tmp_path / "status"
    assert main(["train", "--run-name", "tiny-medium-baseline", "--threads", "0", "--status-file", str(status)]) == 2
    assert "streamback train: error: --threads must be at least 1, got 0" in capsys.readouterr().err
    assert status.read_text() == "2\n"


def test_a_token_budget_larger_than_the_data_is_refused_or_repeated_on_purpose(tokens, tmp_path, capsys):
    from streamback.data.tokenize import tokenize

    data = validate_config(
        {
            "data": {
                "tokenizer": {"kind": "file", "file": str(tokens / "tokenizer.json")},
                "val_fraction": 0.1,
                "train_tokens": 3000,
                "val_tokens": 1000,
                "processes": 1,
            }
        }
    )["data"]
    small = tokenize(data, tmp_path / "small", inputs=[tokens.parent / "part.parquet"], progress=False)
    tokens = tmp_path / "small"
    windows = (small["splits"]["train"]["tokens"] - 1) // 32
    steps, batch = 4, 32
    big = {
        "tokens": steps * batch * 32,
        "batch_size": batch,
        "micro_batch_size": 16,
        "schedule": {"warmup_steps": 1, "decay_steps": 1},
    }
    assert steps * batch > windows  # the run reads more windows than the split holds
    with pytest.raises(
        StreambackError,
        match=rf"{steps * batch:,} windows, but the train split of .* holds .* = {windows:,} windows: "
        rf"the run would read its data {steps * batch / windows:.2f} times",
    ):
        run_inprocess(tokens, tmp_path, **big)
    assert not layout.recipe_dirs(tmp_path / "ckpt")
    assert run_inprocess(tokens, tmp_path, repeat_data=True, **big) == 0
    assert (
        f"train.repeat_data is on: the run reads its train split {steps * batch / windows:.2f} times"
        in capsys.readouterr().err
    )


@pytest.mark.gpu
@pytest.mark.slow
def test_compiled_training_on_a_gpu(tokens, tmp_path):
    """`torchrun --standalone --nproc-per-node 1 -m streamback train` with compile on, as the rule
    launches it: the trainer takes the GPU, its first-step check of the stream's dtype passes, and
    every step's loss is finite and falls; validation and the stream's envelope are recorded.
    (One process builds no process group: FSDP2 with NCCL is test_model's test_fsdp_stream_dtype.)"""
    torchrun = (sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "1")
    proc = cli(tokens, tmp_path, launcher=torchrun, compile=True)
    out, err = proc.communicate(timeout=600)
    assert proc.returncode == 0, err[-3000:]
    assert "residual stream reaches blocks" not in err
    records = read_metrics(tmp_path / "out" / layout.METRICS_FILE)
    losses = [r["loss"] for r in records]
    assert len(records) == STEPS and all(math.isfinite(v) for v in losses)
    assert np.mean(losses[-3:]) < 0.9 * np.mean(losses[:3])
    assert any("val_loss" in r for r in records) and any("stream_absmax" in r for r in records)
    summary = json.loads((tmp_path / "out" / layout.SUMMARY_FILE).read_text())
    assert summary["device"] == "cuda" and summary["processes"] == 1


@pytest.mark.gpu
@pytest.mark.slow
def test_the_shadow_of_a_compiled_baseline_on_a_gpu(tokens, tmp_path):
    """The full-precision shadow where the paper would run it: compiled blocks on CUDA, whose
    shadow (an fp32 stream through the same compiled blocks, recompiled once for it) must leave the
    run's own steps alone and show the bf16 stream's gap to it."""
    assert (
        run_inprocess(
            tokens, tmp_path / "off", run="micro-baseline", compile=True, log={**TRAIN["log"], "shadow_every": 0}
        )
        == 0
    )
    assert run_inprocess(tokens, tmp_path / "on", run="micro-baseline", compile=True) == 0
    off, on = (read_metrics(tmp_path / side / "out" / layout.METRICS_FILE) for side in ("off", "on"))
    # CUDA's kernels need not repeat a run bit for bit (the CPU test, test_watch's, asks for the same bits)
    assert np.allclose([r["loss"] for r in off], [r["loss"] for r in on], rtol=0, atol=2e-3)
    shadows = [r for r in on if "shadow_gap" in r]
    assert shadows and all(
        r["shadow_stream"] == "fp32" and r["shadow_gap"][0] == 0 and 0 < max(r["shadow_gap"]) < 0.05 for r in shadows
    )
    assert all(abs(r["shadow_loss"] - r["loss"]) < 0.05 for r in shadows)


def test_a_dose_with_tied_embeddings_is_refused_before_any_run():
    """model.embedding_init_std would be overwritten by the output projection's init when the embeddings are tied."""
    cfg = validate_config({"model": {"tied_embeddings": True, "embedding_init_std": 4.0}})
    with pytest.raises(StreambackError, match=r"model.shapes.fat-short: embedding_init_std 4.0 has no effect with"):
        check_runs(cfg["train"], cfg["model"])
    tied = validate_config({"model": {"tied_embeddings": True}})
    check_runs(tied["train"], tied["model"])  # the default dose, 1, is TorchTitan's init and fine


def test_the_dose_is_part_of_the_run_s_identity():
    """Two runs that differ only in model.embedding_init_std are two recipes (their checkpoints never
    resume one another), as two shapes are."""
    cfg = load_config(DEFAULT_CONFIG)
    spec = run_matrix(cfg["train"])["tiny-medium-baseline"]
    identities = [
        recipe_identity(
            spec, ModelArgs.from_config(dose_cfg, "tiny-medium", 961), cfg["train"], {"fingerprint": "f" * 64}
        )
        for dose_cfg in (cfg["model"], {**cfg["model"], "embedding_init_std": 256.0})
    ]
    assert [i["model_args"]["embedding_init_std"] for i in identities] == [1.0, 256.0]
    assert recipe_fingerprint(identities[0]) != recipe_fingerprint(identities[1])
