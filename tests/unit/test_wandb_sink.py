"""The optional W&B sink (`train.log.wandb`), offline: the logged series equal metrics.jsonl's, and a
resumed run logs to the same W&B run (its id); without the wandb package, one line. The offline
run files are read with wandb's own protobuf records from the `.wandb` log (LevelDB's log format:
32 KiB blocks of records with a 7-byte header, after W&B's 7-byte file header)."""

import json
import math
import shutil
import struct
import sys
import time

import pytest
import torch

from streamback import layout
from streamback.config import validate_config
from streamback.errors import StreambackError
from streamback.model import compute
from streamback.train import checkpoint as ckpt
from streamback.train import trainer as train_module
from streamback.train.metrics import read_metrics
from streamback.train.tensorboard import scalars

RUN = "micro-baseline"
BLOCK, FULL, LAST = 32768, 1, 4


def config(wandb):
    return validate_config(
        {
            "model": {
                "shapes": {"micro": {"n_layers": 2, "dim": 32, "n_heads": 2, "n_kv_heads": 1, "multiple_of": 16}},
                "max_seq_len": 64,
            },
            "train": {
                "runs": {"shapes": ["micro"], "blocks": ["baseline"], "streams": []},
                "seed": 3,
                "tokens": 10 * 4 * 32,
                "seq_len": 32,
                "batch_size": 4,
                "micro_batch_size": 4,
                "schedule": {"warmup_steps": 2, "decay_steps": 4},
                "checkpoint": {"every": 5, "keep": 2},
                "log": {
                    "every": 5,
                    "val_every": 5,
                    "stream_every": 2,
                    "val_sequences": 4,
                    "tensorboard": False,
                    "wandb": wandb,
                },
            },
        }
    )


def train(tokens, root, wandb):
    cfg = config(wandb)
    torch.set_num_threads(1)
    with compute.use("emulated"):
        return train_module.train(cfg["train"], cfg["model"], RUN, tokens, root / "out", root / "ckpt")


def wandb_records(path):
    """The protobuf records of a .wandb file."""
    from wandb.proto import wandb_internal_pb2

    data, pos, records, part = path.read_bytes(), 7, [], b""
    assert data[:4] == b":W&B"
    while pos + 7 <= len(data):
        left = BLOCK - pos % BLOCK
        _, length, kind = struct.unpack("<IHB", data[pos : pos + 7]) if left >= 7 else (0, 0, 0)
        if length == 0 and kind == 0:  # a block's zero padding
            pos += left
            continue
        part += data[pos + 7 : pos + 7 + length]
        pos += 7 + length
        if kind in (FULL, LAST):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(part)
            records.append(record)
            part = b""
    return records


def start_time(records) -> int:
    """When the W&B run of a .wandb file's records started (its run record's start_time), in nanoseconds."""
    (run,) = [record.run for record in records if record.WhichOneof("record_type") == "run"]
    return run.start_time.ToNanoseconds()


class StartClock:
    """`time` for wandb.init: each run starts `step` seconds after the one before, from a whole second. A step of
    0.1 s puts two quick attempts in one second, as on a fast machine (the case that once ordered them wrong)."""

    def __init__(self, step: float):
        self.second, self.step, self.starts = math.floor(time.time()), step, 0

    def time(self) -> float:
        self.starts += 1
        return self.second + self.step * self.starts

    def __getattr__(self, name):
        return getattr(time, name)


def test_the_wandb_run_holds_the_metrics_and_a_resume_appends_to_it(tokens, tmp_path, monkeypatch):
    wandb = pytest.importorskip("wandb")
    from wandb.sdk import wandb_init

    # both attempts start in one second where wandb names the second one's directory "-1" (wandb/wandb#10511);
    # before that, they would share one, so they start a second apart there
    suffixed = hasattr(wandb_init._WandbInit, "set_sync_dir_suffix")
    monkeypatch.setattr(wandb_init, "time", StartClock(0.1 if suffixed else 1.0))
    monkeypatch.setenv("WANDB_SILENT", "true")
    settings = {"project": "streamback-test", "mode": "offline"}
    assert train(tokens, tmp_path, settings) == 0
    # run.finish() only tells W&B's service that the run is done (inform_finish, not waited for), and a second run
    # of the same id in this process goes to the same service: end it (waited for), as each attempt's own process
    # does at exit, before the next attempt starts
    wandb.teardown()
    first = read_metrics(tmp_path / "out" / layout.METRICS_FILE)  # the first attempt's steps 1-10
    (recipe,) = layout.recipe_dirs(tmp_path / "ckpt")
    shutil.rmtree(ckpt.checkpoint_dir(recipe, 10))  # the second attempt resumes from step 5 and logs steps 6-10 again
    assert train(tokens, tmp_path, settings) == 0
    wandb.teardown()  # every file written whole before it is read
    metrics = read_metrics(tmp_path / "out" / layout.METRICS_FILE)

    # each attempt's W&B file, in the order they started: its run record's start time (nanoseconds), not the
    # directory's name, whose time has one-second resolution (both started in one second here: W&B adds "-1")
    names = sorted(path.name[-2:] for path in (recipe / "wandb").glob("offline-run-*"))
    assert not suffixed or names == ["-1", recipe.name[-2:]]
    paths = (recipe / "wandb").glob("offline-run-*/run-*.wandb")
    attempts = sorted((wandb_records(path) for path in paths), key=start_time)
    assert len(attempts) == 2 and start_time(attempts[0]) < start_time(attempts[1])
    run_id = f"{RUN}-{recipe.name.removeprefix('recipe-')}"
    for records, want in zip(attempts, (first, metrics[5:])):  # each file holds its own attempt's records
        assert {(r.run.run_id, r.run.project) for r in records if r.WhichOneof("record_type") == "run"} == {
            (run_id, "streamback-test")
        }
        assert history(records) == {r["step"]: dict(scalars(r)) for r in want}  # the wall-clock fields too
    # W&B's sync appends both to the run of their id, a later step replacing an earlier one: metrics.jsonl
    assert [r["step"] for r in metrics] == list(range(1, 11)) and first[:5] == metrics[:5]
    assert {"train/loss", "train/val_loss", "stream_absmax/0"} <= set(history(attempts[1])[10])


def history(records) -> dict[int, dict]:
    """{step: {metric: value}} of a .wandb file's history records (W&B's own `_` keys left out)."""
    logged = {}
    for record in records:
        if record.WhichOneof("record_type") == "history":
            items = {item.key or "/".join(item.nested_key): json.loads(item.value_json) for item in record.history.item}
            logged[record.history.step.num] = {k: v for k, v in items.items() if not k.startswith("_")}
    return logged


def test_without_wandb_the_run_stops_in_one_line(tokens, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "wandb", None)  # import wandb raises ImportError
    with pytest.raises(
        StreambackError,
        match=r"^train.log.wandb.project is set but the wandb package is not installed: pip install wandb",
    ) as err:
        train(tokens, tmp_path, {"project": "p", "mode": "offline"})
    assert "\n" not in str(err.value)
