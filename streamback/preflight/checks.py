"""The preflight's checks: each turns measured figures into a named PASS or FAIL with its figure
and its bound, so that a failed check reads as one line (check, figure, bound)."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

GIB = 2**30
# Peak memory may take this share of what the process has: on CUDA the caching allocator's peak
# reservation (fragmentation included) against the device's memory, leaving the rest to the CUDA
# context, cuBLAS workspaces and NCCL buffers, which the allocator does not count; on the CPU the
# peak resident set against the RAM the job may use, leaving the rest to validation and to the
# checkpoint's staging copy, which the preflight's steps do not reach at their peak.
MEMORY_SHARE = 0.9
# A shadow gap (|run's max |h| - shadow's| / shadow's) above this many grid steps of the run's
# stream format at that max, or above 1e-6 for an unrounded fp32 stream (tests/unit/test_watch.py's bounds), fails.
SHADOW_GRID_STEPS = 4
SHADOW_FP32_GAP = 1e-6
# On CUDA the backward's atomics (attention, embedding) make a step's last bits vary: a resumed
# step may then move the weights by up to this share of the learning rate on average (a
# thousandth of a full Adam step); where the kernels are deterministic (the CPU) it must be bitwise.
RESUME_MEAN_SHARE_OF_LR = 1e-3


@dataclass
class Check:
    name: str
    passed: bool
    figure: str  # what was measured, in words and numbers
    bound: str  # what it had to meet
    values: dict  # the figures as numbers, for the table and the tests

    @property
    def status(self) -> str:
        return "PASS" if self.passed else "FAIL"

    def line(self) -> str:
        return f"{self.name}: {self.status}: {self.figure} (bound: {self.bound})"

    def as_dict(self) -> dict:
        return {**asdict(self), "status": self.status}


def stream_dtype(expected: str, forward: list[str], gradients: list[str | None], kernels: str) -> Check:
    """Every layer boundary (0: the embedding, l: after block l - 1) holds the stream in `expected`,
    in the forward and in its gradient (None: no gradient reached it), as computed on `kernels`
    (the run's, e.g. 'bf16 on fp32 kernels on cpu')."""
    wrong = [f"boundary {b} forward {d}" for b, d in enumerate(forward) if d != expected]
    wrong += [f"boundary {b} gradient {d}" for b, d in enumerate(gradients) if d != expected]
    figure = (
        f"all {len(forward)} boundaries {expected} in the forward and the gradients"
        if not wrong
        else f"{', '.join(wrong[:4])}{' ...' if len(wrong) > 4 else ''}"
    )
    return Check(
        "stream_dtype",
        not wrong,
        f"{figure} (on {kernels})",
        f"{expected} at every boundary",
        {"expected": expected, "forward": forward, "gradients": gradients, "kernels": kernels},
    )


def losses(values: list[float]) -> Check:
    """The steps' losses are finite and the last is below the first."""
    finite = all(math.isfinite(v) for v in values)
    passed = finite and len(values) > 1 and values[-1] < values[0]
    figure = "losses " + ", ".join(f"{v:.4f}" for v in values)
    return Check("losses", passed, figure, "finite, the last below the first", {"losses": values})


def budget(run_hours: float, budget_hours: float | None, unit: str) -> Check:
    """The run's projected device-hours against train.budget_gpu_hours (None: no budget, passes)."""
    figure = f"projected {run_hours:,.2f} {unit} for the run"
    bound = (
        f"train.budget_gpu_hours {budget_hours:,.2f}" if budget_hours is not None else "no train.budget_gpu_hours set"
    )
    return Check(
        "budget",
        budget_hours is None or run_hours <= budget_hours,
        figure,
        bound,
        {"projected_hours": run_hours, "budget_hours": budget_hours},
    )


def memory(peak: int, available: int, what: str) -> Check:
    """Peak bytes against MEMORY_SHARE of the bytes available (`what` names both)."""
    bound = MEMORY_SHARE * available
    return Check(
        "memory",
        peak <= bound,
        f"peak {peak / GIB:,.2f} GiB ({what})",
        f"{MEMORY_SHARE:.0%} of {available / GIB:,.2f} GiB",
        {"peak_bytes": peak, "available_bytes": available},
    )


def resume(loss_diff: float, max_diff: float, mean_diff: float, lr: float, bitwise: bool) -> Check:
    """The step after a checkpoint's save and load against the same step uninterrupted: bitwise
    (`bitwise`: deterministic kernels) or a mean weight change within RESUME_MEAN_SHARE_OF_LR x lr."""
    figure = f"loss differs by {loss_diff:.3g}, weights by up to {max_diff:.3g} (mean {mean_diff:.3g})"
    if bitwise:
        passed, bound = loss_diff == 0 and max_diff == 0, "bitwise equal (deterministic kernels)"
    else:
        limit = RESUME_MEAN_SHARE_OF_LR * lr
        passed, bound = (
            math.isfinite(mean_diff) and mean_diff <= limit,
            f"mean weight difference {limit:.3g} ({RESUME_MEAN_SHARE_OF_LR:g} x lr)",
        )
    return Check(
        "resume",
        passed,
        figure,
        bound,
        {"loss_diff": loss_diff, "max_weight_diff": max_diff, "mean_weight_diff": mean_diff},
    )


def shadow(gaps: list[float] | None, bounds: list[float] | None, shadow_loss: float | None, stream: str) -> Check:
    """The shadow's gap at every boundary is finite and within its bound; None: the run's stream is
    the shadow's own (nothing to compare), which passes."""
    if gaps is None:
        return Check(
            "shadow", True, f"the {stream} stream is the shadow's own format", "nothing to compare", {"gaps": None}
        )
    over = [b for b, (g, limit) in enumerate(zip(gaps, bounds)) if not (math.isfinite(g) and g <= limit)]
    finite_loss = shadow_loss is not None and math.isfinite(shadow_loss)
    worst = max(range(len(gaps)), key=lambda b: gaps[b] if math.isfinite(gaps[b]) else math.inf)
    figure = f"largest gap {gaps[worst]:.3g} at boundary {worst}" + (
        "" if finite_loss else f", shadow loss {shadow_loss}"
    )
    if over:
        figure += f"; over its bound at boundaries {over}"
    return Check(
        "shadow",
        not over and finite_loss,
        figure,
        f"gap {bounds[worst]:.3g} at boundary {worst}, finite",
        {"gaps": gaps, "bounds": bounds, "shadow_loss": shadow_loss},
    )


def disk(free: int | None, needed: int, where: str) -> Check:
    """Free bytes under the checkpoint directory against the run's checkpoints and final model."""
    if free is None:
        return Check(
            "disk",
            False,
            f"the free space under {where} cannot be read",
            f"{needed / GIB:,.2f} GiB",
            {"free_bytes": None, "needed_bytes": needed},
        )
    return Check(
        "disk",
        free >= needed,
        f"{free / GIB:,.2f} GiB free under {where}",
        f"{needed / GIB:,.2f} GiB",
        {"free_bytes": free, "needed_bytes": needed},
    )


def speed(tokens_per_s: float, run_hours: float, unit: str, kernels: str) -> Check:
    """The measured speed on `kernels` (the run's): positive and finite (a projection is made from it)."""
    passed = math.isfinite(tokens_per_s) and tokens_per_s > 0
    return Check(
        "speed",
        passed,
        f"{tokens_per_s:,.0f} tokens/s on {kernels}: the run takes {run_hours:,.2f} {unit}",
        "positive and finite",
        {"tokens_per_s": tokens_per_s, "projected_hours": run_hours, "kernels": kernels},
    )
