"""The stream formats' shared test pieces: every format, blocks of values, and the stochastic-rounding verdict."""

import math

import torch

from streamback.model.formats import STREAM_LABELS, StreamFormat

ALL = [StreamFormat.parse(label) for label in STREAM_LABELS]


def one_block(values, size):
    """One block of `size` holding `values` then zeros."""
    x = torch.zeros(size)
    x[: len(values)] = torch.tensor(values, dtype=torch.float32)
    return x


def sr_rows(fmt):
    """A row whose exact values lie between grid points; the first element fixes the block scales."""
    if fmt.name == "mxfp8":  # X = 1 (amax 256): E4M3 grid at scale 1
        return [256.0, 1.3, -7.77, 0.0123, 100.5, -300.0, 0.6]
    if fmt.name == "nvfp4":  # tensor amax 10.5: scale 2^-8; block scales 448 and 256 -> steps of 1.75 and 1
        return [10.5, 1.3, -0.7, 2.6, 5.1, 0.2, -4.4] + [0] * 9 + [6.0, 3.3, -0.3, 0.2]
    return [1.3, -7.77, 0.0123, 100.5, -300.0, 0.6, 1.0 + 2.0**-10]


def sr_verdict(fmt, draws, exact):
    """Draws of `exact` [n, width] rounded stochastically: each bracketed by its draws, both
    neighbours drawn where it is off the grid, the mean within 5 standard errors of it."""
    n, width = exact.shape
    draws = draws.double()
    low, high = draws.min(0).values, draws.max(0).values
    mean = draws.mean(0)
    target = exact[0].double()
    assert (low <= target).all() and (target <= high).all()
    # both neighbours drawn wherever the value is off the grid
    off_grid = (
        StreamFormat(fmt.name).add(fmt.enter(torch.zeros(1, width, device=exact.device)), exact[:1])[0].double()
        != target
    )
    assert (high > low)[off_grid].all()
    # a Bernoulli choice between neighbours `gap` apart has sd <= gap / 2
    tolerance = 5 * (high - low) / 2 / math.sqrt(n)
    assert ((mean - target).abs() <= tolerance).all(), (mean - target, tolerance)


def sr_inputs(fmt, n, device):
    """A zero stream of `n` rows in `fmt` and the exact values [n, width] (sr_rows, repeated) to add to it."""
    width = 32 if fmt.name == "mxfp8" else 16 * 2
    exact = one_block(sr_rows(fmt), width).to(device).expand(n, width)
    return fmt.enter(torch.zeros(n, width, device=device)), exact


def two_steps(fmt, x, d, d16):
    # d16 is a graph input: Inductor would fold an in-graph d.bfloat16() into the fused add
    return fmt.add(fmt.add(fmt.enter(x), d), d16)
