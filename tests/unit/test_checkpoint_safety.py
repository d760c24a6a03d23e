"""A checkpoint cannot run code when it is resumed: a `.metadata` or a non-tensor value that names
anything but what a checkpoint is made of is refused, naming the file (or value) and the class,
and nothing of it runs; a genuine checkpoint still loads bit for bit. A torch that lacks a private
name the reader needs is named before any work, with the tested range."""

import json
import os
import pickle
import subprocess
import sys
import tomllib

import pytest
import torch
from torch.distributed.checkpoint.stateful import Stateful

from streamback.data.shards import file_sha256
from streamback.errors import StreambackError
from streamback.train import checkpoint as ckpt
from streamback.train.dcp_safe import (
    PRIVATE_TORCH_NAMES,
    TESTED_TORCH,
    MetadataUnpickler,
    UnsafeCheckpoint,
    check_torch_names,
)

from conftest import ROOT
from helpers.train import linear_state


class RunsACommand:
    """Unpickled, this would run `command` in a shell."""

    def __init__(self, command):
        self.command = command

    def __reduce__(self):
        return os.system, (self.command,)


def _reseal(path, name):
    """Record file `name`'s new size and sha256 in meta.json and seal it again, as an attacker would."""
    meta = json.loads((path / ckpt.META).read_text())
    meta["files"][name] = {"bytes": (path / name).stat().st_size, "sha256": file_sha256(path / name)}
    meta[ckpt.SEAL] = ckpt._seal(meta)
    (path / ckpt.META).write_text(json.dumps(meta))


def test_a_genuine_checkpoint_loads_bit_for_bit(tmp_path):
    model, optimizer, state = linear_state(0)
    ckpt.save_checkpoint(tmp_path, 5, state, {}, keep=2)
    fresh_model, fresh_opt, fresh_state = linear_state(1)
    assert not torch.equal(fresh_model.weight, model.weight)
    assert ckpt.load_newest(tmp_path, fresh_state)["step"] == 5
    for p, q in zip(model.parameters(), fresh_model.parameters()):
        assert torch.equal(p, q)
        for key in ("exp_avg", "exp_avg_sq", "step"):
            assert torch.equal(optimizer.state[p][key], fresh_opt.state[q][key])
    assert fresh_opt.param_groups[0]["betas"] == (0.9, 0.999) and fresh_opt.param_groups[0]["lr"] == 0.1


def test_a_metadata_that_would_run_a_command_is_refused_and_runs_nothing(tmp_path):
    _, _, state = linear_state(0)
    path = ckpt.save_checkpoint(tmp_path / "ckpt", 5, state, {}, keep=2)
    marker = tmp_path / "ran"
    with open(path / ".metadata", "rb") as f:
        metadata = MetadataUnpickler(f).load()
    metadata.storage_meta = RunsACommand(f"touch {marker}")
    with open(path / ".metadata", "wb") as f:
        pickle.dump(metadata, f)
    _reseal(path, ".metadata")
    assert ckpt.verify_checkpoint(path)  # the seal holds: only the unpickler tells
    _, _, fresh_state = linear_state(1)
    with pytest.raises(UnsafeCheckpoint) as err:
        ckpt.load_newest(tmp_path / "ckpt", fresh_state)
    message = str(err.value)
    assert f"checkpoint file {path / '.metadata'} tries to load posix.system" in message and "\n" not in message
    assert not marker.exists()
    assert (path / ".metadata").exists() and ckpt.list_checkpoints(tmp_path / "ckpt") == [
        (5, path)
    ]  # not moved aside: not damaged, hostile


class _Values(Stateful):
    def __init__(self, value):
        self.value = value

    def state_dict(self):
        return {"weight": torch.ones(2), "setting": self.value}

    def load_state_dict(self, state):
        self.value = state["setting"]


def test_a_value_that_would_run_a_command_is_refused_and_runs_nothing(tmp_path):
    marker = tmp_path / "ran"
    path = ckpt.save_checkpoint(tmp_path / "ckpt", 1, _Values(RunsACommand(f"touch {marker}")), {}, keep=1)
    with pytest.raises(
        UnsafeCheckpoint, match=rf"checkpoint {path}: the value train\.setting of the checkpoint is not plain data"
    ):
        ckpt._load(path, _Values(None))
    assert not marker.exists()
    plain = ckpt.save_checkpoint(tmp_path / "plain", 1, _Values((0.9, 0.95)), {}, keep=1)
    loaded = _Values(None)
    ckpt._load(plain, loaded)
    assert loaded.value == (0.9, 0.95)


def test_a_checkpoint_is_whole_when_dcp_save_returns_metadata_without_its_files(tmp_path, monkeypatch):
    """torch 2.11's FileSystemWriter.finish records the files on a copy of the Metadata, so what
    dcp.save returns has no storage_data (found on an H200, 2026-12-04: every save failed there).
    The checkpoint's file list comes from the .metadata written instead: done the 2.11 way here,
    every file DCP wrote is in meta.json, and the checkpoint verifies and loads."""
    import dataclasses

    finish = ckpt.dcp.FileSystemWriter.finish

    def finish_on_a_copy(self, metadata, results):  # torch 2.11's finish, on this torch's writer
        copy = dataclasses.replace(metadata)
        finish(self, copy, results)
        assert metadata.storage_data is None and copy.storage_data

    monkeypatch.setattr(ckpt.dcp.FileSystemWriter, "finish", finish_on_a_copy)
    model, _, state = linear_state(0)
    path = ckpt.save_checkpoint(tmp_path, 5, state, {}, keep=2)
    written = sorted(f.name for f in path.iterdir() if f.name != ckpt.META)
    assert written == sorted(json.loads((path / ckpt.META).read_text())["files"]) and ".metadata" in written
    assert any(name.endswith(".distcp") for name in written)
    ckpt.verify_checkpoint(path)
    _, _, fresh_state = linear_state(1)
    assert ckpt.load_newest(tmp_path, fresh_state)["step"] == 5


# ---- the torch it runs on ------------------------------------------------------------------------


@pytest.mark.parametrize("module, name", PRIVATE_TORCH_NAMES)
def test_a_torch_without_a_private_name_the_reader_needs_is_named_in_one_line(monkeypatch, module, name):
    owner, _, attribute = f"{module}.{name}".rpartition(".")
    monkeypatch.delattr(f"{owner}.{attribute}")
    with pytest.raises(StreambackError) as err:
        check_torch_names()
    assert str(err.value) == (
        f"torch {torch.__version__} has no {module}.{name}, which streamback's checkpoint reader needs: install "
        f"torch{TESTED_TORCH} (the releases streamback is tested on)"
    )
    monkeypatch.undo()
    check_torch_names()  # this torch has them all


def test_the_tested_torch_range_is_the_declared_one_and_holds_this_torch():
    """pyproject.toml declares the range the reader names, and the torch these tests run on is in it."""
    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    assert f"torch{TESTED_TORCH}" in declared
    floor, ceiling = (tuple(map(int, bound.lstrip("<>=").split("."))) for bound in TESTED_TORCH.split(","))
    assert floor <= tuple(map(int, torch.__version__.split("+")[0].split(".")[:2])) < ceiling


def test_a_stage_on_a_torch_without_a_name_stops_before_any_work():
    """At import, before the stage parses its arguments: one line, exit status 2, no traceback."""
    code = (
        "import sys, torch.serialization; del torch.serialization._get_layout\n"
        "from streamback.cli import main\n"
        "sys.exit(main(['train', '--help']))"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert result.returncode == 2, result.stderr
    assert result.stdout == ""
    assert result.stderr == (
        f"streamback train: error: torch {torch.__version__} has no torch.serialization._get_layout, which streamback's "
        f"checkpoint reader needs: install torch{TESTED_TORCH} (the releases streamback is tested on)\n"
    )
