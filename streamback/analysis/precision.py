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
a flip), as a count and as a fraction of the entries. Memory: the ground truth's three lists stay
on the device (for the 1B shapes about two residuals and one fp32 copy of the blocks' parameters,
~10 GB), and the variants run one at a time, each compared layer by layer and freed.

Swallowed updates. For every sublayer's add into the stream, h' = round(h + d) with the variant's
own stream h and delta d (forward pass only): `swallowed_fraction` is the share of coordinates
with d != 0 where h' == h (the update was rounded away), `lost_mass_fraction` is
sum |h' - (h + d)| / sum |d|, what rounding took from the update, relative to its size (the exact
sum in fp64): `streamback.model.swallow`, whose definitions the trainer's live signals share. A block format (MXFP8,
NVFP4) may also move coordinates whose update is zero, when
the block's scale changes; that counts as lost mass too.
"""

from __future__ import annotations

import pandas as pd
import torch

from streamback.model.swallow import swallow_stats
from streamback.model.weights import TrainedModel, load_model
from streamback.progress import Progress
from streamback.train.validation import next_token_loss

REFERENCES = {"fp64": torch.float64, "fp32": torch.float32}
KINDS = ("activations", "stream_gradients", "gradients")
SUBLAYERS = ("attention", "feed_forward")


def error_stats(x: torch.Tensor, truth: torch.Tensor) -> dict:
    """max |x - truth|, ||x - truth|| / ||truth||, and the entries of opposite sign (count, fraction), in fp64."""
    x, truth = x.double(), truth.double()
    diff = x - truth
    flips = int((((x > 0) & (truth < 0)) | ((x < 0) & (truth > 0))).sum())
    norm = truth.norm()
    return {
        "max_abs_error": float(diff.abs().max()),
        "rel_error": float(diff.norm() / norm) if norm > 0 else float("nan"),
        "sign_flips": flips,
        "sign_flip_fraction": flips / x.numel(),
    }


def _forward_backward(model, batch: torch.Tensor) -> dict[str, list[torch.Tensor]]:
    """One forward and backward pass; per layer the residual, its gradient and the block's parameter gradients
    (detached)."""
    model.zero_grad(set_to_none=True)
    with model.capture(("residual",), grad=True) as cap:
        next_token_loss(model(batch[:, :-1]), batch[:, 1:]).backward()
        residuals = cap["residual"]
    return {
        "activations": [h.detach() for h in residuals],
        "stream_gradients": [h.grad for h in residuals],
        "gradients": [torch.cat([p.grad.flatten() for p in layer.parameters()]) for layer in model.layers],
    }


def reference_model(trained: TrainedModel, reference: str, device):
    """The ground truth: the same weights with compute and stream in `reference` (fp64: parameters too)."""
    dtype = REFERENCES[reference]
    model = load_model(trained, compute_dtype=dtype, stream=reference, device=device)
    return model.to(dtype)


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
    layer, max_abs_error, rel_error, sign_flips, sign_flip_fraction). `compute_dtype`: the
    variants' (default: as trained)."""
    batch = batch.to(device)
    truth_model = reference_model(trained, reference, device)
    truth = _forward_backward(truth_model, batch)
    del truth_model
    if progress is not None:
        progress.update(1, "ground truth")
    rows = []
    for variant in variants:
        torch.manual_seed(seed)  # stochastic rounding draws from the global generator
        model = load_model(trained, compute_dtype=compute_dtype, stream=variant, device=device)
        seen = _forward_backward(model, batch)
        del model
        for kind in KINDS:
            for layer, (x, ref) in enumerate(zip(seen[kind], truth[kind])):
                rows.append({"variant": variant, "kind": kind, "layer": layer, **error_stats(x, ref)})
        del seen
        if progress is not None:
            progress.update(1, variant)
    return pd.DataFrame(rows)


def swallowed(
    trained: TrainedModel,
    batch: torch.Tensor,
    variants: list[str],
    device="cpu",
    seed: int = 0,
    progress: Progress | None = None,
) -> pd.DataFrame:
    """Per variant, layer and sublayer: what the stream's rounding took from each add (columns:
    variant, layer, sublayer, swallowed_fraction, lost_mass_fraction)."""
    inputs = batch[:, :-1].to(device)
    rows = []
    for variant in variants:
        torch.manual_seed(seed)
        model = load_model(trained, stream=variant, device=device)
        with torch.no_grad(), model.capture() as cap:
            model(inputs)
            res, mid = cap["residual"], cap["mid"]
            for layer in range(len(model.layers)):
                adds = {
                    "attention": (res[layer], cap["attention"][layer], mid[layer]),
                    "feed_forward": (mid[layer], cap["feed_forward"][layer], res[layer + 1]),
                }
                for sublayer in SUBLAYERS:
                    rows.append(
                        {"variant": variant, "layer": layer, "sublayer": sublayer, **swallow_stats(*adds[sublayer])}
                    )
        del model, cap, res, mid
        if progress is not None:
            progress.update(1, variant)
    return pd.DataFrame(rows)
