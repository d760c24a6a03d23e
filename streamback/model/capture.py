"""What `Transformer.capture` collects: the residual stream of a forward pass, point by point.

Kept apart from the model so that model.py reads as the model; `Transformer.forward` feeds a
`StreamCapture` (via `_begin` and `_layer`) while a capture is active.
"""

from __future__ import annotations

import torch

STREAM_POINTS = ("residual", "mid", "attention", "feed_forward")


class StreamCapture:
    """The residual stream of the latest forward pass under `Transformer.capture`, by point:
    `residual` (n_layers + 1 entries), `mid`, `attention`, `feed_forward` (n_layers each); with
    `add_fn`, also `adds`: `add_fn(h, delta, h')` of every add into the stream, in order (layer 0's
    attention, its feed-forward, layer 1's, ...: 2 x n_layers entries), each computed as the add
    happens, so that no full-size tensor is held for it. With `grad`, h_0 gets its gradient also where
    the embedding is frozen (h_0 is then made a leaf that requires it)."""

    def __init__(self, points: tuple[str, ...], fn, grad: bool, add_fn=None):
        unknown = set(points) - set(STREAM_POINTS)
        if unknown or not points:
            raise ValueError(f"capture points must be some of {STREAM_POINTS}, got {points}")
        self.points, self.fn, self.grad, self.add_fn = tuple(points), fn, grad, add_fn
        self.wants_parts = add_fn is not None or any(p != "residual" for p in points)
        self._values: dict[str, list] = self._empty()
        self._h = None  # the residual the next layer reads (with add_fn)

    def _empty(self) -> dict[str, list]:
        return {p: [] for p in self.points} | ({"adds": []} if self.add_fn is not None else {})

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
        self._values = self._empty()
        if self.grad and torch.is_grad_enabled() and not h0.requires_grad:
            h0.requires_grad_()  # a frozen embedding's h_0: a leaf, so that its gradient is still taken
        self._keep("residual", h0)
        self._h = h0.detach() if self.add_fn is not None else None

    def _layer(self, out: torch.Tensor, mid=None, attention=None, feed_forward=None) -> None:
        for point, tensor in (
            ("mid", mid),
            ("attention", attention),
            ("feed_forward", feed_forward),
            ("residual", out),
        ):
            if tensor is not None:
                self._keep(point, tensor)
        if self.add_fn is not None:
            with torch.no_grad():
                mid, out = mid.detach(), out.detach()
                self._values["adds"] += [
                    self.add_fn(self._h, attention.detach(), mid),
                    self.add_fn(mid, feed_forward.detach(), out),
                ]
            self._h = out
