"""What `Transformer.capture` collects: the residual stream of a forward pass, point by point.

Kept apart from the model so that model.py reads as the model; `Transformer.forward` feeds a
`StreamCapture` (via `_begin` and `_layer`) while a capture is active.
"""

from __future__ import annotations

import torch

STREAM_POINTS = ("residual", "mid", "attention", "feed_forward")


class StreamCapture:
    """The residual stream of the latest forward pass under `Transformer.capture`, by point:
    `residual` (n_layers + 1 entries), `mid`, `attention`, `feed_forward` (n_layers each)."""

    def __init__(self, points: tuple[str, ...], fn, grad: bool):
        unknown = set(points) - set(STREAM_POINTS)
        if unknown or not points:
            raise ValueError(f"capture points must be some of {STREAM_POINTS}, got {points}")
        self.points, self.fn, self.grad = tuple(points), fn, grad
        self.wants_parts = any(p != "residual" for p in points)
        self._values: dict[str, list] = {p: [] for p in self.points}

    def __getitem__(self, point: str) -> list:
        return self._values[point]

    def _keep(self, point: str, tensor: torch.Tensor) -> None:
        if point not in self._values:
            return
        if self.grad:
            if tensor.requires_grad:
                tensor.retain_grad()
        else:
            tensor = tensor.detach()
        self._values[point].append(tensor if self.fn is None else self.fn(tensor))

    def _begin(self, h0: torch.Tensor) -> None:
        self._values = {p: [] for p in self.points}
        self._keep("residual", h0)

    def _layer(self, out: torch.Tensor, mid=None, attention=None, feed_forward=None) -> None:
        for point, tensor in (("mid", mid), ("attention", attention), ("feed_forward", feed_forward), ("residual", out)):
            if tensor is not None:
                self._keep(point, tensor)
