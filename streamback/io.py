"""File output that never leaves a half-written result (write to a temporary name, then rename),
output directories checked for writing before work starts, and the Markdown tables the reports print."""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from pathlib import Path

from streamback.errors import StreambackError


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike):
    """Yield a temporary path beside `path`; rename it onto `path` only if the block succeeds."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        yield tmp
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()


def writable_dir(path: str | os.PathLike, what: str, keep: bool = True) -> Path:
    """Create the directory `path` (and its parents) if needed and check that a file can be
    written in it; StreambackError naming `what` (e.g. "checkpoint directory") and the path if not.
    keep=False only checks: the directories it created are removed again."""
    path = Path(path)
    created = _missing(path)
    try:
        path.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=path, prefix=".write-test."):  # a unique name: ranks on many hosts probe at once
            pass
    except OSError as err:
        raise StreambackError(f"{what} {path} is not writable ({err.strerror or err}): fix its permissions or choose another directory") from None
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
