"""The loss a model is judged by: next-token cross-entropy, and its mean on each validation window.

The trainer's validation averages `window_losses` over the first `train.log.val_sequences`
windows of the val split (`streamback.train.batches.val_windows`); the analyses compare two
models window by window on the same windows (a paired comparison).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from streamback.train.batches import read_windows


def next_token_loss(logits: torch.Tensor, targets: torch.Tensor, reduction: str = "mean") -> torch.Tensor:
    """Next-token cross-entropy (nats) in fp32 over all positions of the micro-batch."""
    return F.cross_entropy(logits.flatten(0, 1), targets.flatten(), reduction=reduction)


@torch.no_grad()
def window_losses(model, dataset, windows, seq_len: int, micro_batch_size: int, device) -> torch.Tensor:
    """Mean next-token loss (nats) of `model` on each of `windows` of `dataset` (a TokenDataset),
    `micro_batch_size` windows per forward; fp64, [len(windows)], on `device`."""
    out = []
    for start in range(0, len(windows), micro_batch_size):
        batch = read_windows(dataset, windows[start : start + micro_batch_size], seq_len).to(device)
        losses = next_token_loss(model(batch[:, :-1]), batch[:, 1:], reduction="none")
        out.append(losses.view(len(batch), -1).double().mean(dim=1))
    return torch.cat(out) if out else torch.zeros(0, dtype=torch.float64, device=device)
