"""Loss differences: baseline minus the other run of the same shape (StreamBack, or a StreamBack run
with another stream format), so a positive difference means the other run is better, as in the
first seed document.

Curves: from the two runs' metrics.jsonl, step by step (both runs see the same batches at the same
step: batches are a pure function of (seed, step)), the training loss difference and, where both
logged it, the validation loss difference; raw, and smoothed by a trailing mean over the last
`smooth_steps` optimizer steps; thinned to at most `points` steps per curve (the smoothing is done
on every step first).

Final difference: the two final models on the same windows of each split (the first `windows`
windows; of the val split these are the windows the trainer's validation loss uses), one mean
loss per window (`streamback.train.validation.window_losses`), and a paired t interval of the mean
per-window difference: mean(d) +- t(confidence, n - 1) * sd(d) / sqrt(n).
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from streamback.errors import StreambackError
from streamback.model.weights import load_model
from streamback.train.batches import num_windows, val_windows
from streamback.train.validation import window_losses


def paired_difference(baseline: np.ndarray, other: np.ndarray, confidence: float) -> tuple[float, float, float]:
    """mean(baseline - other) and its paired t confidence interval (two-sided)."""
    d = np.asarray(baseline, dtype=np.float64) - np.asarray(other, dtype=np.float64)
    if d.ndim != 1 or len(d) < 2:
        raise StreambackError(f"a paired confidence interval needs at least 2 paired windows, got {d.size}")
    from scipy import stats  # imported here: a second of import time the other analyses need not pay

    mean = float(d.mean())
    half = float(stats.t.ppf(0.5 + confidence / 2, len(d) - 1) * d.std(ddof=1) / math.sqrt(len(d)))
    return mean, mean - half, mean + half


def trailing_mean(steps: np.ndarray, values: np.ndarray, window: int) -> np.ndarray:
    """At each step s (increasing), the mean of the values at steps in (s - window, s]."""
    sums = np.concatenate([[0.0], np.cumsum(values)])
    first = np.searchsorted(steps, steps - window, side="right")
    return (sums[1:] - sums[first]) / (np.arange(1, len(steps) + 1) - first)


def thin(n: int, points: int) -> np.ndarray:
    """Indices of at most `points` of n rows, evenly spaced, the last one always kept."""
    keep = np.arange(0, n, max(1, math.ceil(n / points)))
    return np.unique(np.append(keep, n - 1)) if n else keep


def loss_curves(baseline: list[dict], other: list[dict], smooth_steps: int, points: int) -> pd.DataFrame:
    """Columns split, step, tokens, difference (baseline - other), smoothed; from two runs' metrics records."""
    frames = []
    for split, key in (("train", "loss"), ("val", "val_loss")):
        a = pd.DataFrame([(r["step"], r["tokens"], r[key]) for r in baseline if key in r], columns=["step", "tokens", "a"])
        b = pd.DataFrame([(r["step"], r[key]) for r in other if key in r], columns=["step", "b"])
        both = a.merge(b, on="step").sort_values("step")
        difference = (both.a - both.b).to_numpy(dtype=np.float64)
        smoothed = trailing_mean(both.step.to_numpy(), difference, smooth_steps)
        keep = thin(len(both), points)
        frames.append(pd.DataFrame({"split": split, "step": both.step.to_numpy()[keep], "tokens": both.tokens.to_numpy()[keep],
                                    "difference": difference[keep], "smoothed": smoothed[keep]}))
    return pd.concat(frames, ignore_index=True)


def split_windows(dataset, seq_len: int, count: int, split: str) -> np.ndarray:
    """The first `count` windows of `dataset` (one split of a TokenDataset)."""
    n = num_windows(dataset.num_tokens, seq_len)
    if n < count:
        raise StreambackError(f"the {split} split holds {n} windows of {seq_len} tokens, fewer than analysis.loss_windows = {count}")
    return val_windows(n, count, 0, 1)


def model_window_losses(trained, dataset, windows: np.ndarray, seq_len: int, micro_batch_size: int, device) -> np.ndarray:
    """The model as trained (a model file, or what `read_model` returned): its mean loss (nats) on each window, fp64."""
    model = load_model(trained, device=device)
    return window_losses(model, dataset, windows, seq_len, micro_batch_size, device).cpu().numpy()
