"""TensorBoard event files of a run, written behind its metrics log (`MetricsLog`'s mirror): every
record that goes to metrics.jsonl goes here too, as it is, so the two never disagree.

Scalars at the record's step: `train/<key>` for each number (loss, val_loss, lr, grad_norm,
tokens_per_s, ...), `<key>/<layer>` for each per-layer list (the envelope, the live signals),
`<key>/<name>` for each dict (the norm gains); the step's warnings as text (`warnings`). A run
writes under its own directory (`layout.tensorboard_dir`, one per recipe), so `tensorboard
--logdir results/tensorboard` shows every run of the study side by side while they train. A
resumed run opens its writer with `purge_step` = the first step it trains again, so TensorBoard
drops what an interrupted attempt wrote after its last checkpoint: every step is shown once.
"""

from __future__ import annotations

import math
from pathlib import Path

FLUSH_SECONDS = 30  # how stale a live view can be


def open_writer(log_dir: Path, first_step: int, say):
    """A `TensorBoardWriter` in `log_dir`, or None (said) where the tensorboard package is missing."""
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:  # torch's module needs the tensorboard package
        say(
            "tensorboard is not installed: no event files (pip install tensorboard, or train.log.tensorboard: false to "
            "stop this line)"
        )
        return None
    return TensorBoardWriter(SummaryWriter(str(log_dir), purge_step=first_step, flush_secs=FLUSH_SECONDS))


def scalars(record: dict):
    """(tag, value) of every finite number of a metrics record but its step (see the module docstring)."""
    for key, value in record.items():
        if key in ("step", "warnings"):
            continue
        if isinstance(value, list):
            width = len(str(len(value) - 1))
            items = [(f"{key}/{layer:0{width}d}", v) for layer, v in enumerate(value)]
        elif isinstance(value, dict):
            items = [(f"{key}/{name}", v) for name, v in value.items()]
        else:
            items = [(f"train/{key}", value)]
        yield from ((tag, v) for tag, v in items if isinstance(v, (int, float)) and math.isfinite(v))


class TensorBoardWriter:
    """Writes metrics records as TensorBoard scalars and text (see the module docstring)."""

    def __init__(self, writer):
        self.writer = writer

    def write(self, record: dict) -> None:
        step = record["step"]
        if "warnings" in record:
            self.writer.add_text("warnings", "\n\n".join(event["message"] for event in record["warnings"]), step)
        for tag, value in scalars(record):
            self.writer.add_scalar(tag, value, step)

    def flush(self) -> None:
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()
