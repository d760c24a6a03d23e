"""File output that never leaves a half-written result (write to a temporary name, then rename;
a full disk is a DiskFull naming the file), deletes that never leave the directory they belong to,
output directories checked for writing before work starts, and the Markdown tables the reports print."""

from __future__ import annotations

import contextlib
import errno
import glob
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

from streamback.errors import DiskFull, StreambackError

DISK_FULL_ERRNOS = (errno.ENOSPC, errno.EDQUOT)
LOW_SPACE = 16 << 20  # bytes: a write that failed with less than this free on its filesystem ran out of space


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike, hint: str | None = None):
    """Yield a temporary path beside `path`; rename it onto `path` only if the block succeeds. The
    temporary file is removed however the block ends; one that a killed write left behind (its
    process is gone) is removed, and named, before this one starts. A full disk raises DiskFull
    naming `path`, with `hint` saying what to free."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_temporaries(path)
    tmp = _temporary(path, os.getpid())
    try:
        yield tmp
        os.replace(tmp, path)
    except BaseException as err:
        if not isinstance(err, StreambackError) and disk_full(err, path.parent):
            raise DiskFull(path, free_bytes(path.parent), *([hint] if hint else [])) from err
        raise
    finally:
        if tmp.exists():
            tmp.unlink()


def _temporary(path: Path, pid: int | str) -> Path:
    return path.with_name(f".{path.name}.{pid}.tmp")


def remove_stale_temporaries(path: Path) -> list[Path]:
    """Remove the temporary files of `path` (`atomic_path`'s) whose writing process no longer runs
    on this host, saying so on stderr; returns them."""
    removed = []
    for tmp in sorted(path.parent.glob(f".{glob.escape(path.name)}.*.tmp")):
        pid = tmp.name[len(path.name) + 2 : -len(".tmp")]
        if pid.isdigit() and int(pid) != os.getpid() and not _alive(int(pid)):
            tmp.unlink(missing_ok=True)
            removed.append(tmp)
            print(f"removed {tmp}, left behind by a write of {path} that was killed", file=sys.stderr, flush=True)
    return removed


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)  # no signal: only asks whether the process exists
    except ProcessLookupError:
        return False
    except PermissionError:  # it exists, as another user's
        pass
    return True


def free_bytes(path: str | os.PathLike) -> int | None:
    """The bytes an unprivileged process may still write on the filesystem holding `path`."""
    path = Path(path)
    for candidate in (path, *path.parents):
        with contextlib.suppress(OSError):
            return shutil.disk_usage(candidate).free
    return None


def disk_full(err: BaseException, path: str | os.PathLike) -> bool:
    """Did `err`, raised while writing under `path`, come from a full disk or quota: an OSError
    ENOSPC or EDQUOT anywhere in its chain (DCP's CheckpointException holds each rank's error);
    else, for the writers' own errors (torch's C++ writer says only "unexpected pos"), less than
    LOW_SPACE left on the filesystem."""
    seen, stack, writer_error = set(), [err], False
    while stack:
        e = stack.pop()
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        if isinstance(e, OSError) and e.errno in DISK_FULL_ERRNOS:
            return True
        writer_error |= isinstance(e, (OSError, RuntimeError))
        failures = getattr(e, "failures", None)
        if isinstance(failures, dict):
            stack += [f[0] if isinstance(f, tuple) else f for f in failures.values()]
        stack += [e.__cause__, e.__context__]
    free = free_bytes(path) if writer_error else None
    return free is not None and free < LOW_SPACE


def tree_bytes(directory: str | os.PathLike) -> int:
    """The bytes of the files under `directory`."""
    return sum(f.stat().st_size for f in Path(directory).rglob("*") if f.is_file())


def remove(path: str | os.PathLike, owner: str | os.PathLike) -> None:
    """Delete the file or directory `path` (a symlink itself, never what it points to), which must
    lie inside the directory `owner` once both are resolved: StreambackError, deleting nothing, if
    it does not. Every delete of the package goes through here."""
    path, owner = Path(path), Path(owner)
    target, root = path.parent.resolve() / path.name, owner.resolve()
    if root not in target.parents:
        raise StreambackError(
            f"refusing to delete {path}: it is not inside {owner} ({root}), the only directory this command deletes in"
        )
    if target.is_dir() and not target.is_symlink():
        shutil.rmtree(target)
    else:
        target.unlink(missing_ok=True)


def writable_dir(path: str | os.PathLike, what: str, keep: bool = True) -> Path:
    """Create the directory `path` (and its parents) if needed and check that a file can be
    written in it; StreambackError naming `what` (e.g. "checkpoint directory") and the path if not.
    keep=False only checks: the directories it created are removed again."""
    path = Path(path)
    created = _missing(path)
    try:
        path.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(
            dir=path, prefix=".write-test."
        ):  # a unique name: ranks on many hosts probe at once
            pass
    except OSError as err:
        raise StreambackError(
            f"{what} {path} is not writable ({err.strerror or err}): fix its permissions or choose another directory"
        ) from None
    if not keep:
        _remove_empty(created)
    return path


@contextlib.contextmanager
def output_dir(path: str | os.PathLike, what: str):
    """`writable_dir(path, what)` for a block that fills it: if the block fails, the directories
    this call created are removed again when they are still empty (a failed stage leaves nothing)."""
    path = Path(path)
    created = _missing(path)
    writable_dir(path, what)
    try:
        yield path
    except BaseException:
        _remove_empty(created)
        raise


def _missing(path: Path) -> list[Path]:
    """`path` and those of its parents that do not exist, deepest first."""
    return [p for p in (path, *path.parents) if not p.exists()]


def _remove_empty(directories: list[Path]) -> None:
    for directory in directories:  # deepest first; a directory something was written to stays
        with contextlib.suppress(OSError):
            directory.rmdir()


def write_text(path: str | os.PathLike, text: str) -> None:
    with atomic_path(path) as tmp:
        tmp.write_text(text)


def write_if_changed(path: str | os.PathLike, text: str) -> bool:
    """`text` to `path` (whole or not at all) only where the file does not hold it already, so an
    unchanged file keeps its modification time; True if it was written."""
    try:
        if Path(path).read_text() == text:
            return False
    except (FileNotFoundError, UnicodeDecodeError):
        pass
    write_text(path, text)
    return True


def write_json(path: str | os.PathLike, obj) -> None:
    write_text(path, json.dumps(obj, indent=2, sort_keys=True) + "\n")


def write_csv(path: str | os.PathLike, frame) -> None:
    """A pandas DataFrame as CSV, without its index."""
    with atomic_path(path) as tmp:
        frame.to_csv(tmp, index=False)


def markdown_table(header, rows) -> str:
    """A Markdown table: a header row, the separator, then one line per row (cells as str)."""
    lines = ["| " + " | ".join(map(str, header)) + " |", "|" + "---|" * len(header)]
    return "\n".join(lines + ["| " + " | ".join(map(str, row)) + " |" for row in rows]) + "\n"


def read_json(path: str | os.PathLike, remedy: str):
    """The JSON document at `path`; a missing or unreadable file is a StreambackError naming the
    path and saying what to do (`remedy`, e.g. "run `streamback tokenize` (rule tokenize) first")."""
    path = Path(path)
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        raise StreambackError(f"{path} does not exist: {remedy}") from None
    except json.JSONDecodeError as err:
        raise StreambackError(f"{path} is not valid JSON ({err}): {remedy}") from None


def read_json_record(path: str | os.PathLike):
    """The JSON document at `path`, or None where the file does not exist or does not read as JSON
    (an empty file `snakemake --touch` made): for what the DAG sizes from a record an earlier job
    writes (a tokens manifest, a preflight record), which falls back on the config without one."""
    try:
        return json.loads(Path(path).read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return None
