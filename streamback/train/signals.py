"""What the trainer records of the residual stream every `train.log.stream_every` steps, measured on
that step's own forward passes through `Transformer.capture` (nothing is recomputed, no random
number is drawn, the forward computes what it always does):

- the envelope at each layer boundary, embedding first: `stream_absmax` (max |h|), `stream_max`,
  `stream_min`;
- the live precision signals (`train.log.signals`), per layer l (its attention and feed-forward
  adds, which make boundary l + 1): `swallowed_fraction` and `lost_mass_fraction`, the analyses'
  definitions (`streamback.model.swallow`), and `update_mean_abs`, the mean |d| of the layer's
  non-zero updates (the typical update); per boundary, `stream_spacing`, the stream format's grid
  step at its max |h| (`StreamFormat.spacing`): an update below half of it is lost there;
- `norm_gain_absmax`: max |gain| of every norm (what multiplies the stream), by module name;
- every `train.log.shadow_every` steps, the full-precision shadow (the drift note's
  short full-precision reference along the trajectory, without a second training run): the
  step's micro-batches once more, after its backward and before its optimizer step, so through
  the same weights and compute dtype, without gradients, with the stream in fp64 on the CPU or
  fp32 on CUDA (`shadow_format`; fp64 is the analyses' eager-only reference): `shadow_stream`,
  `shadow_absmax` (its max |h| per boundary), `shadow_gap` (|run's max |h| - shadow's| /
  shadow's, per boundary) and `shadow_loss` (its mean loss, against the step's `loss`). It draws
  no random number and touches no gradient: the run trains the same bits with or without it.

All over the step's global batch: maxima over micro-batches and processes (one all-reduce of MAX),
the swallow counts summed over them (one all-reduce of SUM) before the shares are taken.
"""

from __future__ import annotations

import math

import torch
import torch.distributed as dist

from streamback.model.formats import StreamFormat
from streamback.model.model import norm_gain_absmax
from streamback.model.swallow import swallow_counts, swallow_fractions
from streamback.train.validation import next_token_loss

SIGNAL_KEYS = ("swallowed_fraction", "lost_mass_fraction", "update_mean_abs", "stream_spacing")
SHADOW_KEYS = ("shadow_stream", "shadow_absmax", "shadow_gap", "shadow_loss")


def shadow_format(model, device) -> StreamFormat | None:
    """The shadow's stream: fp64 on the CPU, fp32 on CUDA; None for a run whose stream is that already."""
    fmt = StreamFormat.parse("fp64" if torch.device(device).type == "cpu" else "fp32")
    return None if fmt == model.stream_format else fmt


def roundings_before(boundary: int) -> int:
    """How many times the stream is rounded before layer boundary `boundary` (0: the embedding):
    once as the embedding enters it, then once per add, two adds (attention, feed-forward) a block."""
    return 1 + 2 * boundary


def shadow_gap_bound(fmt: StreamFormat, run_absmax: list[float], shadow_absmax: list[float]) -> list[float]:
    """The largest `shadow_gap` (relative, per boundary) that rounding the stream to `fmt` can
    produce by itself: the bound a healthy stream stays within, however deep.

    The run's and the shadow's streams see the same embedding and (up to their own rounding) the
    same updates; they differ by the run's roundings. Each moves an element by at most half a grid
    step at the element's magnitude under nearest rounding (less than one step under stochastic
    rounding), and no element before boundary b is larger than M_b, the largest max |h| of either
    stream at any boundary up to b. After `roundings_before(b)` roundings an element is off by at
    most roundings_before(b) x share x spacing(M_b), and so is the stream's max |h|
    (| max|a| - max|s| | <= max |a - s|); divided by the shadow's max |h| at b. The bound grows
    linearly with depth: the gap's growth with depth is the paper's effect, not a fault. It leaves
    out how an error, once made, changes the later layers' updates (the sublayers read the stream
    through a norm and a cast to the compute dtype, which take most of it back); the simulation in
    tests/unit/test_watch.py holds it against rounded sums at 20, 40 and 80 layers."""
    share = 1.0 if fmt.rounding == "stochastic" else 0.5
    running, bounds = 0.0, []
    for b, (a, s) in enumerate(zip(run_absmax, shadow_absmax)):
        running = max(running, abs(a), abs(s))
        step = float(fmt.spacing(torch.tensor(running, dtype=torch.float64)))
        bounds.append(roundings_before(b) * share * step / s if s > 0 else (0.0 if running == 0 else math.inf))
    return bounds


def _envelope(h: torch.Tensor) -> torch.Tensor:
    """max |h|, max h and -min h of one residual (fp32; one all-reduce of MAX serves all three)."""
    return torch.stack([h.abs().amax(), h.amax(), -h.amin()]).float()


def _widened(envelope: torch.Tensor | None, residuals: list[torch.Tensor]) -> torch.Tensor:
    """`envelope` [boundaries, 3] widened by one forward pass's `_envelope` of each boundary."""
    seen = torch.stack(residuals)
    return seen if envelope is None else torch.maximum(envelope, seen)


class StreamRecord:
    """One step's record of the stream: `capture()` around its micro-batches, `add` after each
    one's forward pass, `finish` once (a collective under several processes)."""

    def __init__(self, model, signals: bool):
        self.model, self.signals = model, signals
        self.envelope = None  # [boundaries, 3]: max |h|, max h, -min h
        self.counts = None  # [layers, 4]: swallow counts of each layer's two adds
        self.shadowed = None  # (format, its envelope [boundaries, 3], loss summed over micro-batches, micro-batches)

    def capture(self):
        return self.model.capture(("residual",), fn=_envelope, add_fn=swallow_counts if self.signals else None)

    def add(self, stream) -> None:
        self.envelope = _widened(self.envelope, stream["residual"])
        if self.signals:
            counts = torch.stack(stream["adds"]).unflatten(0, (-1, 2)).sum(1)
            self.counts = counts if self.counts is None else self.counts + counts

    def shadow(self, batches: list[torch.Tensor], fmt: StreamFormat) -> None:
        """The full-precision shadow of this step: `batches` (its micro-batches, [B, T + 1] tokens)
        through the model without gradients, with the stream in `fmt`."""
        from torch.distributed.fsdp import FSDPModule

        envelope, loss = None, 0.0
        with torch.no_grad(), self.model.stream_as(fmt), self.model.capture(("residual",), fn=_envelope) as seen:
            for batch in batches:
                loss = (
                    loss + next_token_loss(self.model(batch[:, :-1]), batch[:, 1:]).float()
                )  # as validation: the logits
                envelope = _widened(envelope, seen["residual"])
        # FSDP2 leaves the root's parameters unsharded after a forward (for the backward it expects):
        # the optimizer step updates the shards, so the next forward would read stale gathered copies
        for module in self.model.modules():
            if isinstance(module, FSDPModule):
                module.reshard()
        self.shadowed = fmt, envelope, loss, len(batches)

    def finish(self, env) -> dict:
        """The record's stream fields (see the module docstring)."""

        absmax, top, negated_bottom = env.all_reduce(self.envelope, op=dist.ReduceOp.MAX).T.tolist()
        record = {"stream_absmax": absmax, "stream_max": top, "stream_min": [-v for v in negated_bottom]}
        if self.signals:
            counts = env.all_reduce(self.counts, op=dist.ReduceOp.SUM).cpu()
            shares = [swallow_fractions(c) for c in counts]
            record.update(
                swallowed_fraction=[s["swallowed_fraction"] for s in shares],
                lost_mass_fraction=[s["lost_mass_fraction"] for s in shares],
                update_mean_abs=[
                    mass / updates if updates else float("nan") for updates, _, mass, _ in counts.tolist()
                ],
                stream_spacing=self.model.stream_format.spacing(torch.tensor(absmax)).tolist(),
            )
        record["norm_gain_absmax"] = norm_gain_absmax(self.model)
        if self.shadowed is not None:
            fmt, envelope, loss, micro = self.shadowed
            shadow = env.all_reduce(envelope, op=dist.ReduceOp.MAX)[:, 0].tolist()  # its max |h|
            record.update(
                shadow_stream=fmt.label,
                shadow_absmax=shadow,
                shadow_gap=[abs(a - s) / s for a, s in zip(absmax, shadow)],
                shadow_loss=env.all_reduce(loss.reshape(1)).item() / (micro * env.world_size),
            )
        return record


def signals_table(records_by_run: dict[str, list[dict]]):
    """The live signals of every logged step, one row per run, step and layer (columns: run, step,
    tokens, layer, swallowed_fraction, lost_mass_fraction), from the runs' metrics records."""
    import pandas as pd

    rows = [
        {
            "run": run,
            "step": r["step"],
            "tokens": r["tokens"],
            "layer": layer,
            "swallowed_fraction": swallowed,
            "lost_mass_fraction": lost,
        }
        for run, records in records_by_run.items()
        for r in records
        if "swallowed_fraction" in r
        for layer, (swallowed, lost) in enumerate(zip(r["swallowed_fraction"], r["lost_mass_fraction"]))
    ]
    return pd.DataFrame(rows, columns=["run", "step", "tokens", "layer", "swallowed_fraction", "lost_mass_fraction"])


def shadow_table(records_by_run: dict[str, list[dict]]):
    """Per run with a full-precision shadow: its format, how many steps it shadowed, the largest
    `shadow_gap` over training with its step and boundary, the largest at the last shadowed step,
    and the mean of loss - shadow_loss (columns as named), from the runs' metrics records."""
    import pandas as pd

    rows = []
    for run, records in records_by_run.items():
        shadowed = [r for r in records if "shadow_gap" in r]
        if not shadowed:
            continue
        step, boundary, gap = max(
            ((r["step"], b, g) for r in shadowed for b, g in enumerate(r["shadow_gap"])), key=lambda t: t[2]
        )
        rows.append(
            {
                "run": run,
                "shadow_stream": shadowed[0]["shadow_stream"],
                "shadowed_steps": len(shadowed),
                "max_gap": gap,
                "max_gap_step": step,
                "max_gap_boundary": boundary,
                "last_max_gap": max(shadowed[-1]["shadow_gap"]),
                "loss_minus_shadow": sum(r["loss"] - r["shadow_loss"] for r in shadowed) / len(shadowed),
            }
        )
    return pd.DataFrame(
        rows,
        columns=[
            "run",
            "shadow_stream",
            "shadowed_steps",
            "max_gap",
            "max_gap_step",
            "max_gap_boundary",
            "last_max_gap",
            "loss_minus_shadow",
        ],
    )


def swallowed_chart(table):
    """The live swallowed share against tokens, a panel per run and a line per layer."""
    import altair as alt

    return (
        alt.Chart(table)
        .mark_line(point=True, strokeWidth=1.5)
        .encode(
            x=alt.X("tokens:Q", title="tokens seen"),
            y=alt.Y("swallowed_fraction:Q", title="updates swallowed", axis=alt.Axis(format="%")),
            color=alt.Color("layer:O", title="layer", scale=alt.Scale(scheme="viridis")),
            tooltip=[
                "run",
                "step",
                "layer",
                alt.Tooltip("swallowed_fraction:Q", format=".2%"),
                alt.Tooltip("lost_mass_fraction:Q", format=".2%"),
            ],
        )
        .properties(width=240, height=150)
        .facet(facet=alt.Facet("run:N", title=None), columns=3)
        .properties(
            title=alt.TitleParams(
                "Updates the stream's rounding swallowed, live in training",
                subtitle="Per run and layer, on the logged steps' own forward passes (train.log.stream_every).",
            )
        )
    )
