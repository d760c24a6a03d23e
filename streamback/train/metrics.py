"""The training run's metrics log: `metrics.jsonl`, one JSON record per optimizer step.

Every line is one step, so `pandas.read_json(path, lines=True)` is the step table. What holds for
the whole log sits beside it in `metrics.header.json` (`header_file`; what the trainer gives: the
kernels the run computes on, `kernels`, and each change of them at a resume, `kernel_changes`;
`read_header`). Each record has `step` (1-based: the number of updates done), `tokens` (seen so far), `loss`
(mean over the step's global batch), `lr`, `grad_norm` (before clipping), `tokens_per_s` and
`elapsed_s` (the last two are wall-clock figures, the only non-deterministic fields). Some steps
add `val_loss`; every `train.log.stream_every` steps the stream's record (`streamback.train.signals`):
the envelope at each layer boundary (embedding first) over the step's global batch,
`stream_absmax` (max |h|), `stream_max` (max h) and `stream_min` (min h), the live precision
signals per layer (`swallowed_fraction`, `lost_mass_fraction`, `update_mean_abs`) and per boundary
(`stream_spacing`), and `norm_gain_absmax` (max |gain| of each norm). A step on which a warning
fired has `warnings`, its events (`streamback.train.watch`).

Append-safe across resumes: a run resumed from the checkpoint of step s first cuts the log back
to steps <= s (dropping what a killed run wrote after its last checkpoint, and a half-written
last line), so the log has every step exactly once. The log is flushed and fsynced before a
checkpoint is committed, so the records up to a checkpoint's step always survive a crash. A
mirror (the run's TensorBoard writer, `streamback.train.tensorboard`, and its W&B run,
`streamback.train.wandb_sink`) gets every record appended.

`RunMetrics` is what a training run keeps of its steps as it trains (TorchTitan's
MetricsProcessor): the log with its mirrors, the watch over its records, and the progress line.
"""

from __future__ import annotations

import json
import math
import os
import shutil
from pathlib import Path

from streamback import layout
from streamback.errors import StreambackError
from streamback.io import atomic_path, write_json, write_text
from streamback.progress import Progress
from streamback.train.tensorboard import open_writer
from streamback.train.wandb_sink import open_run as open_wandb
from streamback.train.watch import Watch

DETERMINISTIC = (
    "step",
    "tokens",
    "loss",
    "lr",
    "grad_norm",
    "val_loss",
    "stream_absmax",
    "stream_max",
    "stream_min",
    "norm_gain_absmax",
    "swallowed_fraction",
    "lost_mass_fraction",
    "update_mean_abs",
    "stream_spacing",
    "warnings",
)


def header_file(path: str | os.PathLike) -> Path:
    """The header beside the log at `path`: metrics.jsonl -> metrics.header.json."""
    return Path(path).with_suffix(".header.json")


def read_metrics(path: str | os.PathLike) -> list[dict]:
    """The complete step records of a metrics.jsonl (a half-written last line is skipped, and so is
    the `{"header": ...}` first line that logs held for a while: it is not a step)."""
    return [r for r in _read_lines(path) if "header" not in r]


def read_header(path: str | os.PathLike) -> dict | None:
    """The header of the metrics.jsonl at `path` (from its metrics.header.json, or the first line of
    a log that still holds it); None for a log written before logs had one."""
    beside = header_file(path)
    if beside.exists():
        try:
            return json.loads(beside.read_text())
        except json.JSONDecodeError as err:
            raise StreambackError(f"{beside} is not JSON ({err}); train the run again to rewrite it") from None
    return next((r["header"] for r in _read_lines(path) if "header" in r), None)


def copy_log(source: str | os.PathLike, target: str | os.PathLike) -> None:
    """The log at `source` and its header to `target` and its header, each whole or not at all
    (a temporary name renamed onto the target)."""
    for src, dst in ((Path(source), Path(target)), (header_file(source), header_file(target))):
        if src.exists():
            with atomic_path(dst) as tmp:
                shutil.copyfile(src, tmp)


def _read_lines(path: str | os.PathLike) -> list[dict]:
    """Every complete line of a metrics.jsonl."""
    records = []
    lines = Path(path).read_text().split("\n")
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            if number < len(lines) - 1 or lines[-1] == "":
                raise StreambackError(
                    f"{path}: line {number} is not JSON (only the last line may be cut short)"
                ) from None
    return records


class MetricsLog:
    """Append records to `path`, after cutting it back to the steps <= `resume_step` (kept in
    `resumed`); `header` goes to its metrics.header.json (written again on every start, whole or
    not at all); each record also goes to every one of `mirrors` (`write`, `flush`, `close`)."""

    def __init__(self, path: str | os.PathLike, resume_step: int, mirrors=(), header: dict | None = None):
        self.path, self.mirrors = Path(path), list(mirrors)
        kept = []
        if resume_step > 0 and self.path.exists():
            kept = [r for r in read_metrics(self.path) if r["step"] <= resume_step]
            steps = [r["step"] for r in kept]
            if steps != list(range(1, resume_step + 1)):
                raise StreambackError(
                    f"{self.path}: the log should hold steps 1..{resume_step} to resume from the checkpoint of "
                    f"step {resume_step}, but holds {len(steps)} records"
                    + (f" ending at step {steps[-1]}" if steps else "")
                    + "; restore it or delete the run's checkpoints to start over"
                )
        if header is not None:
            write_json(header_file(self.path), header)
        write_text(self.path, "".join(_line(r) for r in kept))
        self.resumed = kept
        self._file = open(self.path, "a")

    def append(self, record: dict) -> None:
        self._file.write(_line(record))
        self._file.flush()
        for mirror in self.mirrors:
            mirror.write(record)

    def sync(self) -> None:
        """Make every appended record durable (called before a checkpoint is committed)."""
        self._file.flush()
        os.fsync(self._file.fileno())
        for mirror in self.mirrors:
            mirror.flush()

    def close(self) -> None:
        self._file.close()
        for mirror in self.mirrors:
            mirror.close()


class RunMetrics:
    """The records of run `run` (`steps` steps, from `start_step`) as it trains. On rank 0: the
    metrics log in `recipe_dir` with `header`, mirrored to TensorBoard (`tensorboard_dir`; None:
    none) and to W&B as the `train` section `cfg` sets them, and the watch over its records; on
    every rank the progress line, printed by rank 0. `identity`: the recipe, for W&B; `say`: a
    line in the run's log."""

    def __init__(
        self,
        run: str,
        steps: int,
        start_step: int,
        rank: int,
        cfg: dict,
        recipe_dir: Path,
        tensorboard_dir: Path | None,
        identity: dict,
        header: dict,
        stream_label: str,
        say,
    ):
        self.run, self.steps, self.every = run, steps, cfg["log"]["every"]
        self.log, self.watch, self.board = None, None, None
        if rank == 0:
            self.board = open_writer(tensorboard_dir, start_step + 1, say) if tensorboard_dir is not None else None
            mirrors = [self.board] if self.board is not None else []
            if cfg["log"]["wandb"]["project"] is not None:
                name = f"{run}-{recipe_dir.name.removeprefix('recipe-')}"
                mirrors.append(open_wandb(cfg["log"]["wandb"], name, run, recipe_dir, {"identity": identity}))
            self.log = MetricsLog(recipe_dir / layout.METRICS_FILE, start_step, mirrors=mirrors, header=header)
            self.watch = Watch(cfg["log"]["warnings"], cfg["schedule"]["warmup_steps"], stream_label)
            self.watch.replay(self.log.resumed)
        self.progress = Progress(run, steps, unit="step", initial=start_step, active=rank == 0, every_s=None)

    def append(self, step: int, record: dict) -> None:
        """Step `step`'s record (1-based) with the watch's warnings on it (each also a line) to the
        log, and the progress line (printed every `log.every` steps, at a validation and at the end)."""
        if self.watch is not None:
            events = self.watch.observe(record)
            if events:
                record["warnings"] = events
            for event in events:
                self.progress.write(f"[{self.run}] {event['message']}")
        if self.log is not None:
            self.log.append(record)
        val = f" val {record['val_loss']:.4f}" if "val_loss" in record else ""
        self.progress.update(
            1,
            f"loss {record['loss']:.4f}{val} lr {record['lr']:.3e} grad_norm {record['grad_norm']:.3f} "
            f"{record['tokens_per_s']:,.0f} tok/s",
            log=step % self.every == 0 or step == self.steps or bool(val),
        )

    def write(self, line: str) -> None:
        """A line in the run's log (rank 0), beside the progress line."""
        self.progress.write(line)

    def sync(self) -> None:
        """Make every appended record durable (before a checkpoint is committed)."""
        if self.log is not None:
            self.log.sync()

    def close(self) -> None:
        self.progress.close()
        if self.log is not None:
            self.log.close()


def _line(record: dict) -> str:
    return json.dumps({k: _finite_or_text(v) for k, v in record.items()}) + "\n"


def _finite_or_text(value):
    """JSON has no NaN/inf: write them as strings so the log stays valid JSON everywhere."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    return value
