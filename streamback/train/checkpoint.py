"""Crash-safe training checkpoints with torch.distributed.checkpoint (DCP); keep the last K.

A checkpoint of step s is the directory `<root>/step_<s, 9 digits>/`: DCP's shards and
`.metadata` (model parameters and AdamW state, fp32, sharded as FSDP2 holds them, so each rank
writes its own part and a resume may use another number of ranks) plus `meta.json` (the step and
the run's identity). It is written under a temporary name `<root>/.tmp_step_<s>/`, every file
fsynced, and renamed into place by rank 0 only after every rank has finished: the rename is
atomic, so a crash at any moment leaves either the complete checkpoint or none, and a resume
only ever looks at `step_*` directories. Leftover temporary directories are removed when a run
starts. The newest checkpoint is loaded on resume; older ones beyond the last K are deleted.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import warnings
from pathlib import Path

import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.distributed.checkpoint.stateful import Stateful

from streamback.errors import StreambackError

_NAME = re.compile(r"^step_(\d{9})$")


class TrainState(Stateful):
    """The model's and optimizer's state as DCP saves and loads it (sharded under FSDP2)."""

    def __init__(self, model, optimizer):
        self.model, self.optimizer = model, optimizer

    def state_dict(self) -> dict:
        model_state, optim_state = get_state_dict(self.model, self.optimizer)
        return {"model": model_state, "optim": optim_state}

    def load_state_dict(self, state: dict) -> None:
        set_state_dict(self.model, self.optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])


def checkpoint_dir(root: str | os.PathLike, step: int) -> Path:
    return Path(root) / f"step_{step:09d}"


def list_checkpoints(root: str | os.PathLike) -> list[tuple[int, Path]]:
    """The complete checkpoints under `root` as (step, path), oldest first."""
    root = Path(root)
    if not root.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in root.iterdir() if (m := _NAME.match(p.name)) and p.is_dir()]
    return sorted(found)


def _rank() -> int:
    return dist.get_rank() if dist.is_initialized() else 0


def _barrier() -> None:
    if dist.is_initialized():
        dist.barrier()


@contextlib.contextmanager
def _one_process_quietly():
    """DCP warns that it assumes one process when there is no process group: that is intended."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled, unavailable or uninitialized")
        yield


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def remove_partial(root: str | os.PathLike) -> None:
    """Delete temporary directories a crashed save left behind (rank 0; all ranks wait)."""
    root = Path(root)
    if _rank() == 0 and root.is_dir():
        for path in root.glob(".tmp_step_*"):
            shutil.rmtree(path)
    _barrier()


def save_checkpoint(root: str | os.PathLike, step: int, state: TrainState, meta: dict, keep: int) -> Path:
    """Write the checkpoint of `step` atomically (a collective: every rank calls it); prune to `keep`."""
    root = Path(root)
    final = checkpoint_dir(root, step)
    if final.exists():  # already saved (a resumed run that ends where it started)
        return final
    tmp = root / f".tmp_step_{step:09d}"
    if _rank() == 0:
        if tmp.exists():
            shutil.rmtree(tmp)
        tmp.mkdir(parents=True)
    _barrier()
    with _one_process_quietly():
        dcp.save({"train": state}, storage_writer=dcp.FileSystemWriter(tmp, sync_files=True))
    _barrier()
    if _rank() == 0:
        with open(tmp / "meta.json", "w") as f:
            json.dump({**meta, "step": step}, f, indent=2, sort_keys=True)
            f.flush()
            os.fsync(f.fileno())
        _fsync_dir(tmp)
        os.replace(tmp, final)
        _fsync_dir(root)
        for _, old in list_checkpoints(root)[:-keep]:
            shutil.rmtree(old)
    _barrier()
    return final


def read_meta(path: Path) -> dict:
    try:
        return json.loads((path / "meta.json").read_text())
    except (OSError, json.JSONDecodeError) as err:
        raise StreambackError(f"checkpoint {path} has no readable meta.json ({err}); delete it to resume from an older one") from None


def load_checkpoint(path: Path, state: TrainState) -> dict:
    """Load the checkpoint at `path` into `state` (a collective); returns its meta.json."""
    meta = read_meta(path)
    try:
        with _one_process_quietly():
            dcp.load({"train": state}, storage_reader=dcp.FileSystemReader(path))
    except Exception as err:  # DCP raises CheckpointException and others with the failing rank's cause
        raise StreambackError(f"checkpoint {path} cannot be loaded into this model: {err}") from err
    return meta
