"""The learning-rate schedule: warmup-stable-decay (WSD) with a cosine decay to zero.

Steps are counted from 0; `wsd_lr(s, ...)` is the rate used by the optimizer update of step s.
With W warmup steps, D decay steps and T steps in all:

- warmup, s < W: linear, peak * (s + 1) / W, so the first update is not wasted at rate 0 and
  step W - 1 reaches the peak;
- stable, W <= s < T - D: the peak;
- decay, T - D <= s: peak * (1 + cos(pi * (s - T + D) / D)) / 2, which starts at the peak and
  reaches zero at s = T, the step after the last one (and stays there).
"""

from __future__ import annotations

import math


def wsd_lr(step: int, peak_lr: float, total_steps: int, warmup_steps: int, decay_steps: int) -> float:
    """The learning rate of update `step` (0-based) under the WSD schedule above."""
    if step < warmup_steps:
        return peak_lr * (step + 1) / warmup_steps
    decay_start = total_steps - decay_steps
    if step < decay_start or decay_steps == 0:
        return peak_lr
    progress = min(1.0, (step - decay_start) / decay_steps)
    return peak_lr * 0.5 * (1.0 + math.cos(math.pi * progress))
