"""Precision of the stream, measured on the same weights: per-layer error and sign flips against a
ground truth (the paper's motivation figures), and the updates each rounded add
swallows (the drift note's mechanism, inside the trained models).

Layer error. The ground truth is one forward and backward pass of the validation batch with every
step in full precision: compute and stream in fp64 (`reference: fp64`, tiny shapes) or fp32 (the
1B shapes); an fp64 ground truth keeps its parameters in fp64 too, so its gradients are not
rounded to fp32. Each variant is the same weights with the compute dtype as trained (bf16) and
the stream in one format (`bf16` is the baseline's computation, `fp32` StreamBack's, then fp16,
fp8, MXFP8, NVFP4, each also with stochastic rounding). Per layer, against the ground truth:
- `activations`: the residual h_l at each layer boundary (0 = the embedding, L = the last block's output);
- `stream_gradients`: dloss/dh_l, the gradient carried back along the stream (held in the stream's dtype);
- `gradients`: the parameter gradients of block l, all its matrices and norm gains together.
Each row has the maximum absolute error, the relative error ||x - x*|| / ||x*|| (2-norms) and the
sign flips: entries whose sign is the opposite of the ground truth's (a zero on either side is not
a flip), as a count and as a fraction of the entries, compared a cache-sized chunk at a time in fp64.
Memory: two models stay on the device, the ground truth's (with its gradients: for an fp64 truth
16 bytes a parameter) and one for the variants (8 bytes a parameter), whose stream is changed per
variant; the ground truth's three lists are its own residuals and gradients, and the variants run
one at a time, each compared layer by layer and freed. `layer_errors` runs several batches through
the same two models.

Swallowed updates. For every sublayer's add into the stream, h' = round(h + d) with the variant's
own stream h and delta d (forward pass only): `swallowed_fraction` is the share of coordinates
with d != 0 where h' == h (the update was rounded away), `lost_mass_fraction` is
sum |h' - (h + d)| / sum |d|, what rounding took from the update, relative to its size (the exact
sum in fp64): `streamback.model.swallow`, whose definitions the trainer's live signals share. A block format (MXFP8,
NVFP4) may also move coordinates whose update is zero, when
the block's scale changes; that counts as lost mass too.
"""

from __future__ import annotations

import math

import pandas as pd
import torch

from streamback.model.formats import StreamFormat
from streamback.model.swallow import swallow_counts, swallow_fractions
from streamback.model.weights import TrainedModel, load_model
from streamback.progress import Progress
from streamback.train.validation import next_token_loss

REFERENCES = {"fp64": torch.float64, "fp32": torch.float32}
KINDS = ("activations", "stream_gradients", "gradients")
SUBLAYERS = ("attention", "feed_forward")


CHUNK = 1 << 17  # entries compared at once on the CPU, so that the fp64 temporaries stay in the cache


def _error_sums(parts: list[torch.Tensor], truths: list[torch.Tensor]) -> tuple[float, float, int, int]:
    """Over the entries of `parts` against `truths` (tensors pairwise of one shape), in fp64 and a chunk at a
    time: max |x - truth|, sum (x - truth)^2, the entries of opposite sign, and the entries."""
    worst, squares, flips, entries = [], [], [], 0
    for x, truth in zip(parts, truths, strict=True):
        x, truth = x.flatten(), truth.flatten()
        step = max(x.numel(), 1) if x.device.type == "cuda" else CHUNK  # a GPU has no cache to fit, pays per kernel
        for i in range(0, x.numel(), step):
            xs, ts = x[i : i + step], truth[i : i + step]
            diff = xs.to(torch.float64, copy=True).sub_(ts).abs_()
            worst.append(diff.max())
            squares.append(torch.dot(diff, diff))
            flips.append(torch.mul(ts, xs.sign()).lt_(0).sum())  # exactly +-ts or 0: a zero on either side is no flip
        entries += x.numel()
    return float(torch.stack(worst).max()), float(torch.stack(squares).sum()), int(torch.stack(flips).sum()), entries


def _squared_norm(truths: list[torch.Tensor]) -> float:
    return float(sum(torch.dot(t.flatten().double(), t.flatten().double()) for t in truths))


def _stats(parts: list[torch.Tensor], truths: list[torch.Tensor], truth_squares: float) -> dict:
    """`error_stats` of the concatenation of `parts` against that of `truths` (squared 2-norm `truth_squares`)."""
    worst, squares, flips, entries = _error_sums(parts, truths)
    return {
        "max_abs_error": worst,
        "rel_error": math.sqrt(squares) / math.sqrt(truth_squares) if truth_squares > 0 else float("nan"),
        "sign_flips": flips,
        "sign_flip_fraction": flips / entries,
    }


def error_stats(x: torch.Tensor, truth: torch.Tensor) -> dict:
    """max |x - truth|, ||x - truth|| / ||truth||, and the entries of opposite sign (count, fraction), in fp64."""
    return _stats([x], [truth], _squared_norm([truth]))


def _forward_backward(model, batch: torch.Tensor) -> dict[str, list[list[torch.Tensor]]]:
    """One forward and backward pass; per layer the residual, its gradient and the block's parameter gradients
    (detached), each as a list of parts (one tensor; a block's: one per parameter, as `_stats` reads them)."""
    model.zero_grad(set_to_none=True)
    with model.capture(("residual",), grad=True) as cap:
        next_token_loss(model(batch[:, :-1]), batch[:, 1:]).backward()
        residuals = cap["residual"]
    return {
        "activations": [[h.detach()] for h in residuals],
        "stream_gradients": [[h.grad] for h in residuals],
        "gradients": [[p.grad for p in layer.parameters()] for layer in model.layers],
    }


def reference_model(trained: TrainedModel, reference: str, device):
    """The ground truth: the same weights with compute and stream in `reference` (fp64: parameters too)."""
    dtype = REFERENCES[reference]
    model = load_model(trained, compute_dtype=dtype, stream=reference, device=device)
    return model.to(dtype)


def _blocks_only(model):
    """`model` with the parameters outside its blocks frozen (embedding, output head, final norm): their gradients
    are not compared, and a large vocabulary's head makes its weight gradient one of a pass's largest costs."""
    blocks = {id(p) for p in model.layers.parameters()}
    for p in model.parameters():
        if id(p) not in blocks:
            p.requires_grad_(False)
    return model


def layer_errors(
    trained: TrainedModel,
    batches,
    reference: str,
    variants: list[str],
    device="cpu",
    seed: int = 0,
    compute_dtype: torch.dtype | None = None,
    progress: Progress | None = None,
) -> pd.DataFrame:
    """`layer_error` of each of `batches` ([B, T + 1] token tensors) on its own (its own pass and loss), the rows with
    the batch's index (`window`). The ground truth and the variants' model are built once for all batches, the
    variants being one model whose stream changes (`Transformer.stream_as`); each batch's ground truth is
    computed once and held while the variants are compared with it."""
    truth_model = _blocks_only(reference_model(trained, reference, device))
    model = _blocks_only(load_model(trained, compute_dtype=compute_dtype, stream=variants[0], device=device))
    rows = []
    for window, batch in enumerate(batches):
        batch = batch.to(device)
        truth = _forward_backward(truth_model, batch)
        squares = {kind: [_squared_norm(parts) for parts in truth[kind]] for kind in KINDS}
        if progress is not None:
            progress.update(1, "ground truth")
        for variant in variants:
            torch.manual_seed(seed)  # stochastic rounding draws from the global generator
            with model.stream_as(StreamFormat.parse(variant)):
                seen = _forward_backward(model, batch)
            for kind in KINDS:
                for layer, (x, ref, norm) in enumerate(zip(seen[kind], truth[kind], squares[kind], strict=True)):
                    rows.append(
                        {"variant": variant, "kind": kind, "layer": layer, **_stats(x, ref, norm), "window": window}
                    )
            del seen
            if progress is not None:
                progress.update(1, variant)
        del truth
    return pd.DataFrame(rows)


def layer_error(
    trained: TrainedModel,
    batch: torch.Tensor,
    reference: str,
    variants: list[str],
    device="cpu",
    seed: int = 0,
    compute_dtype: torch.dtype | None = None,
    progress: Progress | None = None,
) -> pd.DataFrame:
    """Per variant, kind and layer: the error against the ground truth (columns: variant, kind,
    layer, max_abs_error, rel_error, sign_flips, sign_flip_fraction) of one pass over `batch`.
    `compute_dtype`: the variants' (default: as trained)."""
    table = layer_errors(trained, [batch], reference, variants, device, seed, compute_dtype, progress)
    return table.drop(columns="window")


def swallowed(
    trained: TrainedModel,
    batch: torch.Tensor,
    variants: list[str],
    device="cpu",
    seed: int = 0,
    progress: Progress | None = None,
) -> pd.DataFrame:
    """Per variant, layer and sublayer: what the stream's rounding took from each add (columns:
    variant, layer, sublayer, swallowed_fraction, lost_mass_fraction). One model, its stream
    changed per variant; each add's sums are taken as it happens (`StreamCapture`'s add_fn)."""
    inputs = batch[:, :-1].to(device)
    model = load_model(trained, stream=variants[0], device=device)
    rows = []
    for variant in variants:
        torch.manual_seed(seed)
        with (
            torch.no_grad(),
            model.stream_as(StreamFormat.parse(variant)),
            model.capture(("residual",), add_fn=swallow_counts) as cap,
        ):
            model(inputs)
            adds = cap["adds"]
        for index, counts in enumerate(adds):
            rows.append(
                {"variant": variant, "layer": index // 2, "sublayer": SUBLAYERS[index % 2], **swallow_fractions(counts)}
            )
        del cap, adds
        if progress is not None:
            progress.update(1, variant)
    return pd.DataFrame(rows)
