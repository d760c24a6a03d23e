"""What a run says of itself besides its step records: the lines that open its log (`start_lines`:
what it trains, where, from which step), and once finished its outputs besides its model: the
snapshots of eval.last_checkpoints put into the output directory (last/step_<N>.pt), the metrics
log copied there, and summary.json (what was trained, how long it took, on which kernels). The
live metrics log is `streamback.train.metrics`'s."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from streamback import layout
from streamback.io import atomic_path, write_json
from streamback.runs import RunSpec
from streamback.train.metrics import copy_log, read_metrics


def start_lines(
    spec: RunSpec,
    start_step: int,
    steps: int,
    batch: str,
    params: int,
    device: str,
    stream: str,
    recipe_dir: Path,
    tensorboard_dir: Path | None,
) -> list[str]:
    """The lines that open the log of run `spec` starting (or resuming) at `start_step` of `steps`:
    its `batch` (its tokens, shape and split over processes, in words), `params` on `device` (its
    type and kernel path, in words), block and `stream`, its checkpoints (`recipe_dir`) and event
    files (`tensorboard_dir`; None: none); a recipe trained to its end, and the run's other recipes
    kept beside it, each add a line."""
    what = f"resuming from step {start_step}" if start_step else "starting"
    lines = [
        f"[{spec.name}] {what}: {steps} steps of {batch}; {params:,} parameters on {device}; "
        f"block {spec.block}, stream {stream}; checkpoints in {recipe_dir}"
        + (f"; TensorBoard event files in {tensorboard_dir}" if tensorboard_dir is not None else "")
    ]
    if start_step == steps:
        lines.append(
            f"[{spec.name}] this recipe was trained to its end: its outputs are written again from its last "
            "checkpoint, the same weights and metrics as before (training is deterministic). To train it again "
            f"from its first step, delete {recipe_dir} and rerun"
        )
    others = [p.name for p in layout.recipe_dirs(recipe_dir.parent) if p != recipe_dir]
    if others:
        lines.append(
            f"[{spec.name}] the checkpoints of this run's other recipes are kept ({', '.join(others)}); "
            "`streamback checkpoints` says how they differ, `streamback checkpoints --prune` removes them"
        )
    return lines


def summary_record(
    spec: RunSpec,
    stream: str,
    params: int,
    step: int,
    tokens_per_step: int,
    elapsed: float,
    processes: int,
    device: str,
    recipe_dir: Path,
    kernel_record: dict,
    embedding_init_std: float = 1.0,
) -> dict:
    """summary.json's record of a run trained to step `step`: its spec, its embedding's initial std
    (the dose; the rest of its shape is model.shapes[shape]), tokens, parameters, the
    final losses of its metrics log (in `recipe_dir`), `elapsed` seconds and the GPU-hours they
    make, `processes` on `device` ('cpu', 'cuda'), its last checkpoint and its kernels."""
    records = read_metrics(recipe_dir / layout.METRICS_FILE)
    last = records[-1] if records else {}
    gpus = processes if device == "cuda" else 0
    return {
        "run": spec.name,
        "shape": spec.shape,
        "embedding_init_std": embedding_init_std,
        "block": spec.block,
        "stream": stream,
        "seed": spec.seed,
        "init_seed": spec.init_seed,
        "data_seed": spec.data_seed,
        "steps": step,
        "tokens": step * tokens_per_step,
        "params": params,
        "final_loss": last.get("loss"),
        "final_val_loss": last.get("val_loss"),
        "train_seconds": elapsed,
        "processes": processes,
        "device": device,
        "gpu_hours": elapsed * gpus / 3600,
        "checkpoint": str(recipe_dir / f"step_{step:09d}"),
        **kernel_record,
    }


def write_outputs(outdir: Path, recipe_dir: Path, snapshot_steps: list[int], summary: dict) -> None:
    """Into `outdir`: each snapshot kept in `recipe_dir` as last/step_<N>.pt, the metrics log and its header, and
    `summary` as summary.json (last: its presence says the run finished)."""
    for snapshot in snapshot_steps:
        target = outdir / layout.SNAPSHOTS_DIR / layout.SNAPSHOT_FILE.format(step=snapshot)
        with atomic_path(target) as tmp:
            _link_or_copy(layout.snapshot_stash(recipe_dir, snapshot), tmp)
    copy_log(recipe_dir / layout.METRICS_FILE, outdir / layout.METRICS_FILE)  # and its header
    write_json(outdir / layout.SUMMARY_FILE, summary)


def _link_or_copy(source: Path, target: Path) -> None:
    """`target` as a hard link to `source`, or a copy where they lie on different filesystems."""
    try:
        os.link(source, target)
    except OSError:
        shutil.copyfile(source, target)
