"""Crash-safe, verified training checkpoints with torch.distributed.checkpoint (DCP); keep the last K.

A run keeps one directory per recipe, `<run's checkpoint directory>/recipe-<fingerprint>/`
(`recipe_fingerprint` of the run's identity: model arguments, seed, token budget, batch,
optimizer, schedule, data), so a changed recipe never resumes from, or prunes, another's
checkpoints; `streamback checkpoints` (`streamback.train.recipes`) lists each run's recipes, how
they differ, and `--prune` removes those no longer in use. A checkpoint of step s is the directory
`<root>/step_<s, 9 digits>/`
of its recipe's directory `<root>`: DCP's shards and
`.metadata` (model parameters and AdamW state, fp32, sharded as FSDP2 holds them, so each rank
writes its own part and a resume may use another number of ranks) plus `meta.json` (the step,
the run's identity, and the size and sha256 of every other file, sealed by the sha256 of its own
fields). It is written under a temporary name `<root>/.tmp_step_<s>/`, every file fsynced and
hashed (each rank hashes the files it wrote), and renamed into place by rank 0 only after every
rank has finished: the rename is atomic, so a crash at any moment leaves either the complete
checkpoint or none, and a resume only ever looks at `step_*` directories. A save that fails
removes its temporary directory (a full disk is a DiskFull naming the checkpoint and what to
free); those a killed run left behind are removed, and named, when a run starts; older
checkpoints beyond the last K are deleted. Nothing is deleted outside the recipe's directory.

A resume (`load_newest`) verifies the newest checkpoint before loading it (the ranks share the
hashing): a missing, truncated or changed file, or a meta.json that does not match its seal,
names the checkpoint and the file; the checkpoint is moved aside to `<root>/corrupt-step_<s>/`
(kept for a look, never loaded or pruned) and the previous one is tried. If none passes,
nothing is moved and the run stops.

The trust boundary: DCP's loader unpickles `.metadata` (`pickle.load`) and every non-tensor value
(`torch.load(weights_only=False)`), so to it a checkpoint is code, and the sha256 in meta.json
authenticates nothing (whoever can write the files can rewrite it). A resume therefore reads
`.metadata` through an unpickler that admits only the classes DCP's metadata is made of, and
the non-tensor values with `torch.load(weights_only=True)` (`streamback.train.dcp_safe`): a checkpoint that names
anything else is refused, naming the file and the
class, before anything of it runs. As a second line, it refuses a checkpoint whose directory or
any file in it another user owns, or its group or others may write (`check_trusted`), naming it;
a save writes its checkpoint writable by its owner alone.

The run's lock (`trainer.lock`, one trainer per run across nodes) is `streamback.train.runlock`'s.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import stat
import warnings
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.distributed.checkpoint.stateful import Stateful

from streamback.data.shards import file_sha256
from streamback.errors import DiskFull, StreambackError
from streamback.io import disk_full, free_bytes, remove, tree_bytes
from streamback.train.dcp_safe import SafeFileSystemReader, SafeLoadPlanner, UnsafeCheckpoint, read_dcp_metadata

STEP_NAME = re.compile(r"^step_(\d{9})$")  # a checkpoint directory of a recipe
_RANK_FILE = re.compile(r"^__(\d+)_")  # DCP's FileSystemWriter names rank r's files __<r>_<k>.distcp
META, SEAL, CORRUPT_PREFIX = "meta.json", "meta_sha256", "corrupt-"
_HASH_THREADS = 4


class TrainState(Stateful):
    """The model's and optimizer's state as DCP saves and loads it (sharded under FSDP2)."""

    def __init__(self, model, optimizer):
        self.model, self.optimizer = model, optimizer

    def state_dict(self) -> dict:
        model_state, optim_state = get_state_dict(self.model, self.optimizer)
        return {"model": model_state, "optim": optim_state}

    def load_state_dict(self, state: dict) -> None:
        set_state_dict(self.model, self.optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])


class CorruptCheckpoint(StreambackError):
    """A checkpoint whose files do not match what its meta.json recorded when it was written."""

    def __init__(self, path: Path, problems: list[str]):
        self.path, self.problems = path, problems
        super().__init__(f"checkpoint {path}: " + "; ".join(problems))


def recipe_fingerprint(identity: dict) -> str:
    """16 hex digits of the sha256 of a run's identity (canonical JSON): its recipe directory's name."""
    return hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:16]


def checkpoint_dir(root: str | os.PathLike, step: int) -> Path:
    return Path(root) / f"step_{step:09d}"


def list_checkpoints(root: str | os.PathLike) -> list[tuple[int, Path]]:
    """The complete checkpoints under `root` as (step, path), oldest first."""
    root = Path(root)
    if not root.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in root.iterdir() if (m := STEP_NAME.match(p.name)) and p.is_dir()]
    return sorted(found)


def _rank() -> int:
    return dist.get_rank() if dist.is_initialized() else 0


def _world() -> int:
    return dist.get_world_size() if dist.is_initialized() else 1


def _barrier() -> None:
    if dist.is_initialized():
        dist.barrier()


def _gather(obj) -> list:
    """`obj` from every rank, in rank order (a collective)."""
    if not dist.is_initialized():
        return [obj]
    out = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out


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


def _seal(meta: dict) -> str:
    """sha256 of meta.json's fields other than the seal (canonical JSON)."""
    return hashlib.sha256(json.dumps({k: v for k, v in meta.items() if k != SEAL}, sort_keys=True).encode()).hexdigest()


def _hash_files(directory: Path, names: list[str]) -> dict[str, dict]:
    """{name: {"bytes", "sha256"}} of these files of `directory`, a few at a time."""

    def one(name):
        path = directory / name
        return name, {"bytes": path.stat().st_size, "sha256": file_sha256(path)}

    with ThreadPoolExecutor(_HASH_THREADS) as pool:
        return dict(pool.map(one, names))


def remove_partial(root: str | os.PathLike, say=print) -> None:
    """Delete the temporary directories a killed save left behind, naming each through `say` (rank
    0; all ranks wait)."""
    root = Path(root)
    if _rank() == 0 and root.is_dir():
        for path in sorted(root.glob(".tmp_step_*")):
            remove(path, root)
            say(f"removed {path}, the temporary directory of a checkpoint save that was killed")
    _barrier()


def _no_write_but_owner(path: Path) -> None:
    """Take write permission from group and others (a umask of 002 gives it to the group)."""
    mode = path.stat().st_mode
    if mode & 0o022:
        os.chmod(path, stat.S_IMODE(mode) & ~0o022)


def save_checkpoint(root: str | os.PathLike, step: int, state: TrainState, meta: dict, keep: int) -> Path:
    """Write the checkpoint of `step` atomically, with the sha256 of every file (a collective:
    every rank calls it); prune to the newest `keep`."""
    root = Path(root)
    final = checkpoint_dir(root, step)
    if final.exists():  # already saved (a resumed run that ends where it started)
        return final
    tmp = root / f".tmp_step_{step:09d}"
    if _rank() == 0:
        if tmp.exists():
            remove(tmp, root)
        tmp.mkdir(parents=True)
    _barrier()
    try:
        files = _write(tmp, state)
        if _rank() == 0:
            record = {**meta, "step": step, "files": files}
            record[SEAL] = _seal(record)
            with open(tmp / META, "w") as f:
                json.dump(record, f, indent=2, sort_keys=True)
                f.flush()
                os.fsync(f.fileno())
            for path in [tmp, *(tmp / name for name in [*files, META])]:
                _no_write_but_owner(path)
            _fsync_dir(tmp)
            os.replace(tmp, final)
            _fsync_dir(root)
    except BaseException as err:  # DCP's CheckpointException is a BaseException
        full = disk_full(err, root)
        free = free_bytes(root) if full else None
        if _rank() == 0 and tmp.exists():
            remove(tmp, root)
        if full:
            previous = list_checkpoints(root)
            size = f"; the previous checkpoint takes {tree_bytes(previous[-1][1]) / 1e6:,.1f} MB" if previous else ""
            raise DiskFull(
                final,
                free,
                f"free space there{size} (`streamback checkpoints --prune` deletes the checkpoints of "
                "recipes no longer in use; corrupt-step_* directories can go; train.checkpoint.keep "
                "says how many are kept), then rerun: the run resumes from its last checkpoint",
            ) from None
        raise
    if _rank() == 0:
        for _, old in list_checkpoints(root)[:-keep]:
            remove(old, root)
    _barrier()
    return final


def _write(tmp: Path, state: TrainState) -> dict[str, dict]:
    """DCP's files of `state` in `tmp` (a collective), and {name: {"bytes", "sha256"}} of each:
    every rank hashes the files it wrote (still in its page cache), rank 0 also DCP's .metadata."""
    with _one_process_quietly():
        dcp.save({"train": state}, storage_writer=dcp.FileSystemWriter(tmp, sync_files=True))
    # the files named by the .metadata written (every rank sees it once dcp.save returns), not by the
    # Metadata dcp.save returns: torch 2.11's FileSystemWriter.finish sets storage_data on a copy
    written = read_dcp_metadata(tmp / ".metadata")
    names = sorted({info.relative_path for info in written.storage_data.values()} | {".metadata"})
    mine = [n for n in names if _owner(n, _world()) == _rank()]
    files = {}
    for part in _gather(_hash_files(tmp, mine)):
        files.update(part)
    return files


def _owner(name: str, world: int) -> int:
    """The rank that hashes file `name` of a checkpoint when it is written: the rank that wrote it."""
    m = _RANK_FILE.match(name)
    return int(m.group(1)) % world if m else 0


def read_meta(path: Path) -> dict:
    """A checkpoint's meta.json, checked against its seal; CorruptCheckpoint if it cannot be trusted."""
    try:
        meta = json.loads((path / META).read_text())
    except OSError as err:
        raise CorruptCheckpoint(path, [f"{META} cannot be read ({err.strerror or err})"]) from None
    except ValueError as err:
        raise CorruptCheckpoint(path, [f"{META} is not valid JSON ({err})"]) from None
    if not isinstance(meta, dict):
        raise CorruptCheckpoint(path, [f"{META} does not hold an object"])
    if SEAL in meta and meta[SEAL] != _seal(meta):
        raise CorruptCheckpoint(path, [f"{META} does not match its own sha256 (it changed after it was written)"])
    return meta


def verify_checkpoint(path: Path) -> dict:
    """Check every file of the checkpoint at `path` against the sizes and sha256 its meta.json
    recorded (a collective: the ranks share the files); returns the meta.json, or raises
    CorruptCheckpoint naming each file that is missing, has another size or other contents, or
    that meta.json records no file hashes (nothing could be verified)."""
    meta = read_meta(path)
    files = meta.get("files")
    if files is None:
        raise CorruptCheckpoint(path, [f"{META} records no file hashes, so its files cannot be verified"])
    names = sorted(files)
    mine = names[_rank() :: _world()]
    problems = []
    for name in mine:
        want, file = files[name], path / name
        if not file.is_file():
            problems.append(f"{name} is missing")
        elif (size := file.stat().st_size) != want["bytes"]:
            problems.append(f"{name} is {size:,} bytes, {META} records {want['bytes']:,} (truncated or overwritten)")
        elif file_sha256(file) != want["sha256"]:
            problems.append(
                f"the sha256 of {name} differs from the one {META} recorded (its contents changed after it was written)"
            )
    problems = sorted(p for part in _gather(problems) for p in part)
    if problems:
        raise CorruptCheckpoint(path, problems)
    return meta


def load_checkpoint(path: Path, state: TrainState) -> dict:
    """Verify the checkpoint at `path` and load it into `state` (a collective); returns its meta.json."""
    meta = verify_checkpoint(path)
    _load(path, state)
    return meta


def check_trusted(path: Path) -> None:
    """Refuse to load the checkpoint directory `path` (StreambackError naming each offender) if
    it or any file in it is owned by another user, or its group or others may write it: loading
    unpickles `.metadata`, so whoever can write a checkpoint can run code in this process."""
    me, problems = os.geteuid(), []
    for item in [path, *sorted(path.iterdir())]:
        st = item.stat()  # a symlink is judged by what it points to
        if st.st_uid != me:
            problems.append(f"{item} is owned by {_user(st.st_uid)}, not by you ({_user(me)})")
        elif st.st_mode & 0o022:
            problems.append(f"{item} may be written by its group or others ({stat.filemode(st.st_mode)})")
    if problems:
        raise StreambackError(
            f"not resuming from checkpoint {path}: loading a checkpoint runs its pickled .metadata, so only one "
            "that no one else can have written is loaded:\n  "
            + "\n  ".join(problems)
            + "\nMove it away (the run then resumes from an older one, or starts over), or if you trust it make it "
            f"yours: chown -R {_user(me)} {path} && chmod -R go-w {path}"
        )


def _user(uid: int) -> str:
    import pwd

    try:
        return f"{pwd.getpwuid(uid).pw_name} (uid {uid})"
    except KeyError:
        return f"uid {uid}"


def _load(path: Path, state: TrainState) -> None:
    check_trusted(path)
    read_dcp_metadata(path / ".metadata")  # refused here, by every rank, before DCP's collective
    try:
        with _one_process_quietly():
            dcp.load({"train": state}, storage_reader=SafeFileSystemReader(path), planner=SafeLoadPlanner())
    except (
        Exception,
        CheckpointException,
    ) as err:  # DCP raises CheckpointException (a BaseException) with the failing rank's cause
        causes = [cause for cause, _ in err.failures.values()] if isinstance(err, CheckpointException) else [err]
        if unsafe := [cause for cause in causes if isinstance(cause, UnsafeCheckpoint)]:
            raise UnsafeCheckpoint(f"checkpoint {path}: {unsafe[0]}") from None
        raise StreambackError(f"checkpoint {path} cannot be loaded into this model: {err}") from err


def load_newest(
    root: str | os.PathLike, state: TrainState, accept=None, say=print, at_most: int | None = None
) -> dict | None:
    """Load the newest checkpoint under `root` (of a step <= `at_most`, if given) that passes
    `verify_checkpoint` into `state` (a collective) and return its meta.json; None if there is no
    checkpoint. Each newer one that
    fails is named through `say`, with what is wrong, and moved aside to corrupt-step_<s>.
    `accept(path, meta)` may refuse the one found by raising StreambackError (e.g. it belongs to
    another recipe): that stops the run, it does not fall back. If every checkpoint fails,
    StreambackError lists them all and nothing is moved."""
    root = Path(root)
    failed: list[CorruptCheckpoint] = []
    for step, path in reversed(list_checkpoints(root)):
        if at_most is not None and step > at_most:
            continue
        try:
            meta = verify_checkpoint(path)
        except CorruptCheckpoint as err:
            failed.append(err)
            continue
        if accept is not None:
            accept(path, meta)
        _load(path, state)
        for err in failed:
            aside = _set_aside(err.path)
            say(f"{err}; moved aside to {aside}, resuming from {path} instead")
        return meta
    if failed:
        raise StreambackError(
            f"no checkpoint in {root} passes its check, so the run cannot resume:\n  "
            + "\n  ".join(map(str, failed))
            + f"\nRestore them from a copy, or delete {root} to start the run over"
        )
    return None


def _set_aside(path: Path) -> Path:
    """Rename a corrupt checkpoint out of the step_* namespace (rank 0; all ranks wait)."""
    aside = path.with_name(CORRUPT_PREFIX + path.name)
    if _rank() == 0:
        if aside.exists():
            remove(aside, path.parent)
        os.replace(path, aside)
    _barrier()
    return aside
