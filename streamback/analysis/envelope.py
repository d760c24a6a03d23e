"""The residual stream's envelope: how far it reaches at each layer boundary.

On the validation batch, each model as trained (its own stream and compute dtype): per boundary
(0 = the embedding, L = the last block's output) the largest and smallest value of h (signed: the
paper's "reach", which found the skinny-tall StreamBack model's negative reach
collapsed) and the 99.9th percentile of |h| (what the bulk of the stream reaches, apart from
its few massive activations). Over training, the same maximum and minimum as the trainer logged
them every `train.log.stream_every` steps (`streamback.train.metrics`), against tokens.
"""

from __future__ import annotations

import math

import pandas as pd
import torch

from streamback.errors import StreambackError
from streamback.model.weights import TrainedModel, load_model

QUANTILE = 0.999


def abs_quantile(x: torch.Tensor, q: float = QUANTILE) -> float:
    """The q-quantile of |x| over all entries, interpolated linearly between order statistics
    (numpy's default), from the top ceil((1 - q) n) + 1 values only (torch.quantile refuses more
    than 2^24 entries, fewer than a 1B model's residual holds)."""
    a = x.detach().abs().flatten()
    n = a.numel()
    position = q * (n - 1)
    below = math.floor(position)
    top = torch.topk(a, n - below).values.double()  # descending: top[-1] is the order statistic `below`
    low = top[-1]
    high = top[-2] if len(top) > 1 else low
    return float(low + (position - below) * (high - low))


def _reach(h: torch.Tensor) -> tuple[float, float, float]:
    return float(h.max()), float(h.min()), abs_quantile(h)


def envelope(trained: TrainedModel, batch: torch.Tensor, device="cpu") -> pd.DataFrame:
    """Per layer boundary of the model as trained, on `batch`: max, min and abs_p999 of h."""
    model = load_model(trained, device=device)
    with torch.no_grad(), model.capture(("residual",), fn=_reach) as cap:
        model(batch[:, :-1].to(device))
        reach = cap["residual"]
    return pd.DataFrame(
        [
            {"layer": layer, "max": top, "min": bottom, "abs_p999": p999}
            for layer, (top, bottom, p999) in enumerate(reach)
        ]
    )


def training_envelope(records: list[dict], run: str) -> pd.DataFrame:
    """The envelope the trainer logged (metrics.jsonl records): per logged step and layer boundary,
    tokens, absmax, max and min."""
    rows = [
        {"step": r["step"], "tokens": r["tokens"], "layer": layer, "absmax": absmax, "max": top, "min": bottom}
        for r in records
        if "stream_max" in r
        for layer, (absmax, top, bottom) in enumerate(zip(r["stream_absmax"], r["stream_max"], r["stream_min"]))
    ]
    if not rows:
        raise StreambackError(
            f"run {run}: its metrics.jsonl has no stream_max/stream_min records (train.log.stream_every "
            "larger than the run's steps, or a run trained before they were logged: train it again)"
        )
    return pd.DataFrame(rows)
