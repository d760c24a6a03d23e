"""The preflight's checks: each turns measured figures into a named PASS or FAIL with its figure
and its bound, so that a failed check reads as one line (check, figure, bound)."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

from streamback.train.signals import roundings_before

GIB = 2**30
# Peak memory may take this share of what the process has: on CUDA the caching allocator's peak
# reservation (fragmentation included) against the device's memory, leaving the rest to the CUDA
# context, cuBLAS workspaces and NCCL buffers, which the allocator does not count; on the CPU the
# peak resident set against the RAM the job may use, leaving the rest to validation and to the
# checkpoint's staging copy, which the preflight's steps do not reach at their peak.
MEMORY_SHARE = 0.9
# A shadow gap (|run's max |h| - shadow's| / shadow's, per layer boundary) fails above what rounding
# the stream to its format can produce by itself over the adds before that boundary
# (`streamback.train.signals.shadow_gap_bound`: half a grid step at the stream's max per rounding,
# one per add), and never below a floor. The floor is what a stream finer than the compute dtype
# (fp32) picks up from the bf16 sublayers: a stream a few fp32 steps off rounds some sublayer
# inputs to the next bf16 value, and the updates carry that on. It grows with the adds:
# SHADOW_FP32_GAP, or SHADOW_GAP_PER_ROUNDING a rounding where more (the 80-layer micro StreamBack
# run after the preflight's steps: 5.7e-6 at boundary 63, 4.5e-8 a rounding; docs/measurements.md).
SHADOW_FP32_GAP = 1e-6
SHADOW_GAP_PER_ROUNDING = 2e-7
# The loss check: at most this many optimizer steps on one fixed batch at the recipe's peak learning
# rate, within which the batch's mean token loss must fall by this many standard errors of that
# mean (its sampling noise: a smaller drop is within what another draw of as many tokens gives).
# A healthy tiny model at the paper's lr 4e-4 passes in 2 to 6 steps, 2 to 80 layers (docs/preflight.md).
LEARN_STEPS = 16
LEARN_NOISE_UNITS = 2.0
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


def learn_threshold(before: dict) -> float:
    """The drop a batch's mean token loss must pass to count as learning: LEARN_NOISE_UNITS standard
    errors of that mean (`before`: {"mean", "sd", "tokens"} of its token losses)."""
    return LEARN_NOISE_UNITS * before["sd"] / math.sqrt(before["tokens"])


def learned(before: dict, after: float) -> bool:
    return before["mean"] - after > learn_threshold(before)


def losses(steps: list[float], before: dict, after: float, taken: int, lr: float) -> Check:
    """The training steps' losses are finite, and the model learns: one fixed batch's mean token
    loss, `before` ({"mean", "sd", "tokens"}), fell to `after` over `taken` steps on it at `lr` by
    more than `learn_threshold`."""
    finite = all(math.isfinite(v) for v in [*steps, before["mean"], after])
    drop = before["mean"] - after
    threshold = learn_threshold(before)
    figure = (
        f"one batch's loss {before['mean']:.4f} -> {after:.4f} over {taken} steps on it at lr {lr:.3g} "
        f"(a drop of {drop:.4f}); the steps' losses " + ", ".join(f"{v:.4f}" for v in steps)
    )
    bound = (
        f"finite, and a drop above {threshold:.4f} within {LEARN_STEPS} steps: {LEARN_NOISE_UNITS:g} standard "
        f"errors of the batch's mean token loss (sd {before['sd']:.3f} over {before['tokens']:,} tokens)"
    )
    values = {"losses": steps, "before": before, "after": after, "drop": drop, "threshold": threshold}
    return Check("losses", finite and drop > threshold, figure, bound, {**values, "steps_taken": taken, "lr": lr})


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


def shadow_floor(boundary: int) -> float:
    """The smallest bound a shadow gap is held to at `boundary` (see SHADOW_GAP_PER_ROUNDING)."""
    return max(SHADOW_FP32_GAP, SHADOW_GAP_PER_ROUNDING * roundings_before(boundary))


def shadow(
    gaps: list[float] | None,
    rounding: list[float] | None,
    shadow_loss: float | None,
    stream: str,
    grid: list[float] | None = None,
) -> Check:
    """The shadow's gap at every boundary is finite and within what rounding alone gives there
    (`rounding`, from `streamback.train.signals.shadow_gap_bound`) or its floor (`shadow_floor`);
    None: the run's stream is the shadow's own (nothing to compare), which passes.
    `grid`: the format's grid step at the shadow's max |h| relative to it, per boundary, to say the
    gaps in grid steps (the depth profile: the gap grows with the adds, as the paper measures)."""
    if gaps is None:
        return Check(
            "shadow", True, f"the {stream} stream is the shadow's own format", "nothing to compare", {"gaps": None}
        )
    bounds = [max(shadow_floor(b), r) for b, r in enumerate(rounding)]
    over = [b for b, (g, limit) in enumerate(zip(gaps, bounds)) if not (math.isfinite(g) and g <= limit)]
    finite_loss = shadow_loss is not None and math.isfinite(shadow_loss)
    worst = max(range(len(gaps)), key=lambda b: gaps[b] if math.isfinite(gaps[b]) else math.inf)
    # the boundary nearest its bound: the one a failure names, or the tightest one of a pass
    tightest = over[0] if over else max(range(len(gaps)), key=lambda b: gaps[b] / bounds[b] if bounds[b] else 0.0)
    steps = [g / s if s else math.nan for g, s in zip(gaps, grid)] if grid is not None else None
    figure = f"largest gap {gaps[worst]:.3g} at boundary {worst}" + (
        f" ({steps[worst]:.3g} {stream} grid steps at the shadow's max |h|)" if steps is not None else ""
    )
    figure += "" if finite_loss else f", shadow loss {shadow_loss}"
    if over:
        figure += f"; over its bound at boundaries {over}"
    else:
        figure += f"; nearest its bound at boundary {tightest}: {gaps[tightest]:.3g}"
    return Check(
        "shadow",
        not over and finite_loss,
        figure,
        f"gap {bounds[tightest]:.3g} at boundary {tightest} ("
        + (
            f"rounding to {stream} alone over {roundings_before(tightest)} roundings"
            if rounding[tightest] >= shadow_floor(tightest)
            else f"the floor of {roundings_before(tightest)} roundings"
        )
        + "), finite",
        {"gaps": gaps, "bounds": bounds, "rounding_bounds": rounding, "grid_steps": steps, "shadow_loss": shadow_loss},
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


def speed(tokens_per_s: float, run_hours: float, unit: str, kernels: str, timed_steps: int) -> Check:
    """The measured speed on `kernels` (the run's), the median over `timed_steps` steps: positive and
    finite (a projection is made from it)."""
    passed = math.isfinite(tokens_per_s) and tokens_per_s > 0
    return Check(
        "speed",
        passed,
        f"{tokens_per_s:,.0f} tokens/s on {kernels}: the run takes {run_hours:,.2f} {unit} "
        f"(the median of {timed_steps} timed steps)",
        "positive and finite",
        {"tokens_per_s": tokens_per_s, "projected_hours": run_hours, "kernels": kernels, "timed_steps": timed_steps},
    )
