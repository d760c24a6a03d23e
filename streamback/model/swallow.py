"""What rounding an add into the residual stream takes from the update, defined once.

For h' = round(h + d), the stream h, the sublayer's update d (its delta) and h' as the stream
holds it: the swallowed share is the share of coordinates with d != 0 where h' == h (the update
was rounded away, as 600 + 1.9 is in bf16), the lost mass is sum |h' - (h + d)| / sum |d| (what
rounding took from the update relative to its size, the exact sum in fp64). The analyses
(`streamback.analysis.precision`) measure them on trained models, the trainer
(`streamback.train.signals`) live on a training step's own forward pass; both from here.
"""

from __future__ import annotations

import math

import torch

SWALLOW_COUNTS = ("updates", "swallowed", "update_mass", "lost_mass")


def swallow_counts(h: torch.Tensor, delta: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """The sums behind the two shares of out = round(h + delta), as an fp64 tensor in the order of
    `SWALLOW_COUNTS`: non-zero updates, those that left h unchanged, sum |delta|, sum |out - (h + delta)|.
    Sums of several adds (layers, micro-batches, processes) add up before `swallow_fractions`."""
    moved = delta != 0
    return torch.stack(
        [
            moved.sum(dtype=torch.float64),
            (out == h).logical_and_(moved).sum(dtype=torch.float64),  # compared exactly in the stream's own dtype
            delta.abs().sum(dtype=torch.float64),
            out.double()
            .sub_(h)
            .sub_(delta)
            .abs_()
            .sum(),  # in fp64, exact while h and delta are within 2^29 of each other
        ]
    )


def swallow_fractions(counts) -> dict:
    """`swallowed_fraction` and `lost_mass_fraction` of `swallow_counts` (NaN where there is no update)."""
    updates, swallowed, mass, lost = (float(c) for c in counts)
    return {
        "swallowed_fraction": swallowed / updates if updates else math.nan,
        "lost_mass_fraction": lost / mass if mass > 0 else math.nan,
    }


def swallow_stats(h: torch.Tensor, delta: torch.Tensor, out: torch.Tensor) -> dict:
    """For out = round(h + delta): the share of non-zero updates that left h unchanged, and
    sum |out - (h + delta)| / sum |delta| (the exact sum in fp64)."""
    return swallow_fractions(swallow_counts(h, delta, out))
