"""Progress of a long stage: a tqdm bar on a terminal; in a log file (or under Slurm) plain lines,
each with the count done, the rate and an estimate of the time left. `plain_logs` keeps the
libraries' own bars out of a log file."""

from __future__ import annotations

import os
import sys
import time


def on_terminal() -> bool:
    """Is progress shown on a terminal (a bar), not written to a log file (plain lines)?"""
    return sys.stderr.isatty()


def plain_logs() -> None:
    """In a log file, turn off the tqdm bars of the libraries a stage calls (lm-eval's, datasets'),
    whose carriage-return updates bury the log's lines; the stage's own `Progress` prints plain
    ones. tqdm reads TQDM_DISABLE when it is imported: call this first. (A bar made with an
    explicit disable=False ignores it: `streamback.eval.lm` turns lm-eval's one such off itself.)"""
    if not on_terminal():
        os.environ.setdefault("TQDM_DISABLE", "1")


def _duration(seconds: float) -> str:
    seconds = int(round(seconds))
    return f"{seconds // 3600}h{seconds // 60 % 60:02d}m" if seconds >= 3600 else f"{seconds // 60}m{seconds % 60:02d}s"


class Progress:
    """Counts `unit`s of `name` towards `total` (None: unknown), from `initial` (a resumed stage).

    `update(n, status)` adds n. On a terminal the bar shows `status`; otherwise a line is
    printed to stderr when `log=True` is passed, or, with `every_s` set, when that many seconds
    have passed since the last line. `write` prints a message either way. Inactive (`active=False`,
    e.g. on every rank but the first) it prints nothing.
    """

    def __init__(
        self,
        name: str,
        total: int | None = None,
        unit: str = "it",
        initial: int = 0,
        active: bool = True,
        every_s: float | None = 30.0,
    ):
        self.name, self.total, self.unit, self.active, self.every_s = name, total, unit, active, every_s
        self.done = self.initial = initial
        self.t0 = self.last = time.monotonic()
        self.bar = None
        if active and on_terminal():
            from tqdm import tqdm

            self.bar = tqdm(
                total=total, initial=initial, desc=name, unit=unit, unit_scale=True, dynamic_ncols=True, file=sys.stderr
            )

    def update(self, n: int = 1, status: str = "", log: bool | None = None) -> None:
        self.done += n
        if not self.active:
            return
        if self.bar is not None:
            if status:
                self.bar.set_postfix_str(status, refresh=False)
            self.bar.update(n)
            return
        now = time.monotonic()
        if log or (log is None and self.every_s is not None and now - self.last >= self.every_s):
            self.last = now
            print(f"[{self.name}] {self.line()}" + (f" {status}" if status else ""), file=sys.stderr, flush=True)

    def rate(self) -> float:
        """Units per second since the start (resumed units not counted)."""
        return (self.done - self.initial) / max(time.monotonic() - self.t0, 1e-9)

    def line(self) -> str:
        """e.g. "40/60 step, 2.1 step/s, 0m10s left" (or the count, rate and time so far)."""
        rate, elapsed = self.rate(), time.monotonic() - self.t0
        count = f"{self.done:,}" + (f"/{self.total:,}" if self.total else "")
        text = f"{count} {self.unit}, {rate:,.1f} {self.unit}/s"
        if self.total and rate > 0:
            return text + f", {_duration(max(self.total - self.done, 0) / rate)} left"
        return text + f", {_duration(elapsed)} so far"

    def write(self, line: str) -> None:
        if not self.active:
            return
        if self.bar is not None:
            self.bar.write(line, file=sys.stderr)
        else:
            print(line, file=sys.stderr, flush=True)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
