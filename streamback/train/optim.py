"""The recipe's optimizer step apart from the loop: AdamW of `train.optimizer`, the clipping of
the gradients' global norm, the seed of each step's random numbers, and `Diverged`, the step
whose loss or gradient norm is NaN or infinite (nothing of it is applied)."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import torch


class Diverged(Exception):
    """The loss or gradient norm of a step is NaN or infinite."""


def diverged_message(run: str, err: Diverged, recipe_dir: Path, last_saved: int | None) -> str:
    """The line that stops a diverged run: what diverged, the last good checkpoint and what to change."""
    where = (
        f"{recipe_dir}/step_{last_saved:09d} (step {last_saved})"
        if last_saved
        else "none (the run diverged before its first checkpoint)"
    )
    return (
        f"[{run}] stopped: {err}. Nothing of this step was applied or saved; the last good checkpoint is {where}. "
        "A rerun resumes from it and meets the same batches again: change the recipe (e.g. a lower "
        "train.optimizer.lr), which trains from its first step in a directory of its own."
    )


def step_seed(*parts: int) -> int:
    """A 63-bit seed for torch from integers (seed, step, rank, purpose), well mixed by numpy."""
    return int(np.random.SeedSequence(list(parts)).generate_state(1, dtype=np.uint64)[0] >> np.uint64(1))


def adamw(params, opt: dict) -> torch.optim.AdamW:
    """The optimizer of `train.optimizer` over `params`: AdamW, fused (one kernel per parameter
    group on CUDA and the CPU alike; on the CPU faster than foreach in a tiny step)."""
    return torch.optim.AdamW(
        params, lr=opt["lr"], betas=tuple(opt["betas"]), eps=opt["eps"], weight_decay=opt["weight_decay"], fused=True
    )


def clip_gradients(params, opt: dict) -> torch.Tensor:
    """Clip the gradients' global norm to `train.optimizer.grad_clip` (0: no clipping); the norm before
    clipping (a DTensor under FSDP2)."""
    return torch.nn.utils.clip_grad_norm_(params, opt["grad_clip"] or math.inf, foreach=True)
