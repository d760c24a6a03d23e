"""What an eager training step moves, counted on fake tensors: bytes per operator, and the live
signals' share of the step.

`Traffic` counts, for every operator that writes memory (one whose outputs include a new storage,
or one that writes in place), the bytes of its tensor inputs (read) and outputs (written), and its
elementwise work: the elements of the largest tensor it touches (one operation each). An eager
step launches about one kernel per operator, so the sums are the unfused step's traffic.
`benchmarks/stream_traffic.py` prints it per block; `signals_cost` gives what the trainer's live
precision signals (`streamback.train.signals`, on a step every `train.log.stream_every`) add to a
training step, as shares of the step's bytes and of its model FLOPs (TorchTitan's count), which
`streamback bench` reports beside its measured time.
"""

from __future__ import annotations

import contextlib

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from streamback.measure.step import fake_training_step, flops_per_token
from streamback.model.model import Transformer
from streamback.model.reversible import storage_id
from streamback.train.signals import StreamRecord


def _tensors(tree) -> list[torch.Tensor]:
    return [t for t in tree_leaves(tree) if isinstance(t, torch.Tensor)]


class Traffic(TorchDispatchMode):
    """Bytes read (tensor inputs) and written (outputs), and elementwise operations, of every
    operator that writes memory: one whose outputs include a new storage, or one that writes in place."""

    def __init__(self):
        super().__init__()
        self.bytes = 0
        self.elements = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        inputs, outputs = _tensors((args, kwargs)), _tensors(out)
        known = {storage_id(t) for t in inputs}
        if func._schema.is_mutable or any(storage_id(t) not in known for t in outputs):
            self.bytes += sum(t.nbytes for t in inputs) + sum(t.nbytes for t in outputs)
            self.elements += max((t.numel() for t in inputs + outputs), default=0)
        return out


def step_traffic(margs, batch: int, seq_len: int, signals: bool | None = None) -> Traffic:
    """The traffic of one eager forward + backward at `batch` x `seq_len`; with `signals` not None,
    inside the trainer's stream record (`StreamRecord`: the envelope, and the live signals if true)."""

    traffic = Traffic()

    @contextlib.contextmanager
    def watch(model):
        with traffic, StreamRecord(model, signals).capture() if signals is not None else contextlib.nullcontext():
            yield

    fake_training_step(margs, batch, seq_len, watch)
    return traffic


def signals_cost(margs, batch: int, seq_len: int, stream_every: int) -> dict:
    """What the live signals add to a training step on average (they run on one step in
    `stream_every`): `bytes_share` of the step's bytes moved and `flops_share` of its model FLOPs,
    with the counts behind them per signal step (`bytes`, `operations`) and the step's (`step_bytes`,
    `step_flops`). The signals' cost is the stream record with them minus without (the envelope
    was logged before them); per micro-batch, as the trainer measures every micro-batch."""

    plain = step_traffic(margs, batch, seq_len)
    without, with_signals = step_traffic(margs, batch, seq_len, False), step_traffic(margs, batch, seq_len, True)
    extra_bytes, extra_ops = with_signals.bytes - without.bytes, with_signals.elements - without.elements
    with torch.device("meta"):
        step_flops = flops_per_token(Transformer(margs), seq_len) * batch * seq_len
    return {
        "bytes": extra_bytes,
        "operations": extra_ops,
        "step_bytes": plain.bytes,
        "step_flops": step_flops,
        "bytes_share": extra_bytes / (stream_every * plain.bytes),
        "flops_share": extra_ops / (stream_every * step_flops),
    }
