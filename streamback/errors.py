"""The package's error types: bad input (config, data, checkpoints, arguments) named clearly, and a full disk."""

from __future__ import annotations


class StreambackError(Exception):
    """A problem with the user's input; the CLI prints its message and exits with status 2."""


class DiskFull(StreambackError):
    """No space (or quota) left while writing `path`: the message names it, the room left on its
    filesystem and what to free (`hint`)."""

    def __init__(self, path, free: int | None = None, hint: str = "free space there (or write elsewhere), then rerun"):
        self.path, self.free = path, free
        room = f" ({free / 1e6:,.1f} MB free on its filesystem)" if free is not None else ""
        super().__init__(f"no space left on device while writing {path}{room}: {hint}")
