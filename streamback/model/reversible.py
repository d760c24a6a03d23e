"""The reversible residual stream: drop the saved fp32 residuals, rebuild them on the way back.

A StreamBack layer only adds to its fp32 stream: mid_i = h_i + delta0_i, h_{i+1} = mid_i +
delta1_i, with bf16 deltas (the attention and feed-forward outputs). The residuals h_i and mid_i
that autograd saves for the backward pass (the RMSNorms' inputs) can therefore be thrown away
on the forward pass and rebuilt from the top one, h_L, by subtraction: mid_i = h_{i+1} -
delta1_i, h_i = mid_i - delta0_i, at the cost of keeping the deltas. Per layer that keeps two
bf16 tensors instead of two fp32 ones: half of the stream's share of the saved activations.
The bottom of the stream needs no delta: h_0 is the token embedding, recomputed exactly from the
tokens (`bottom`), so delta0_0 is not kept. That pays for the one residual kept in fp32, the
top h_L (the final norm's input): the reversible StreamBack model then saves exactly the bytes
the baseline (bf16 stream) saves, 2 bytes per element per residual, and its memory estimate
(`streamback.measure.memory`) equals the baseline's.

How (the paper's scheme, made robust): the model's forward runs inside
`ReversibleStream`, a `torch.autograd.graph.saved_tensors_hooks` context. Every tensor autograd
saves is wrapped in a `_Saved`. After each block (`step`), the wrappers holding that block's
two residuals (matched by storage, offset, shape, stride and dtype, so a view or a copy is never
mistaken for one) let go of their tensor and keep a slot number instead. On the backward pass
the unpack hook rebuilds a slot by walking down from the lowest slot rebuilt so far, popping one
delta per step, so at most three rebuilt residuals and the deltas not yet consumed are alive.

Rebuilding is not exact: fp32 subtraction does not undo fp32 addition bit for bit.
`benchmarks/reversible_error.py` measures it (its figures: docs/measurements.md): the rebuilt
residuals are off by a few fp32 ulps of max |h|, growing from the top layer down, and the
reversible model's gradients differ from the plain model's by orders of magnitude less than the
baseline's (bf16 stream) differ from StreamBack's, the effect under study; bf16 compute mostly
rounds the difference away.

No exact variant is offered. Exactness needs each addition's fp32 rounding error (TwoSum's
error term): up to 8 significant bits while |delta| < |h|, up to 24 where the stream is small.
Kept even as bf16 (then not always exact), two per layer cost 4 bytes per element, exactly the
4 bytes the reversible stream saves over the plain model's two fp32 residuals (8 bytes vs 2 x 2
for the deltas): nothing would be left of the saving. Kahan-style compensation of the rebuild
chain cannot recover bits the forward addition already rounded away. And an error orders of
magnitude below the effect under study, and below bf16 compute's own resolution (2^-8), does
not need removing.

Scope and limits:
- One backward per forward (a rebuilt slot is consumed; `retain_graph` double use raises).
- Memory: on the backward pass a rebuilt residual is held only while it has uses left (plus the
  lowest one, where the walk down resumes), so the backward adds at most a few fp32 residuals.
- With activation checkpointing (`TransformerBlock.activation_checkpoint`) autograd saves only
  each block's input (torch.utils.checkpoint's input saver runs under these hooks), which is
  dropped and rebuilt before the block is recomputed; the mid residual is recomputed.
- torch.compile of each block (`streamback.train.parallel.apply_compile`, the trainer's mode): the
  compiled blocks' saved tensors pass through these hooks like eager ones and both residuals of
  every layer are dropped; a compiled block unpacks them in forward order, which is why a
  rebuilt residual is kept until all its uses are unpacked (counted per slot), not just until
  the next one down is rebuilt. torch.compile of the whole model also runs and is correct,
  but dynamo breaks the graph at these hooks and only about half of the residuals are dropped:
  compile per block.
"""

from __future__ import annotations

import torch


class _Saved:
    """What autograd stores for one saved tensor: the tensor, or the slot it is rebuilt from."""

    __slots__ = ("tensor", "slot")

    def __init__(self, tensor: torch.Tensor):
        self.tensor, self.slot = tensor, None


def storage_id(t: torch.Tensor) -> int:
    """Identity of the storage behind `t` (its StorageImpl, shared by every view of it). Unlike
    `data_ptr()` it is also defined for fake tensors (`streamback.measure.memory`'s estimates)."""
    return t.untyped_storage()._cdata


def _same_tensor(a: torch.Tensor, b: torch.Tensor) -> bool:
    return (
        a.dtype == b.dtype
        and a.device == b.device
        and a.shape == b.shape
        and a.stride() == b.stride()
        and a.storage_offset() == b.storage_offset()
        and storage_id(a) == storage_id(b)
    )


def step_back(residual: torch.Tensor, delta: torch.Tensor) -> torch.Tensor:
    """The residual before `delta` was added: the inverse of `fp32 + delta`, up to rounding.
    (One kernel: the bf16 delta is converted as it is read, as in `StreamFormat.add`.)"""
    return residual - delta


def step_back_block(top: torch.Tensor, delta1: torch.Tensor, delta0: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """A block's two residuals below its output `top`: (mid, h) = (top - delta1, mid - delta0),
    `step_back` twice, bit for bit. `streamback.train.parallel.apply_compile` compiles it for a
    compiled model: one kernel then reads `top` and both deltas once and writes both residuals
    (16 bytes an element instead of two eager mixed-dtype kernels' 20, which do not vectorise)."""
    mid = step_back(top, delta1)
    return mid, step_back(mid, delta0)


@torch.no_grad()
def forward_residuals(model, tokens: torch.Tensor):
    """Every residual of a forward pass, (h_0, mid_0, h_1, ..., mid_{L-1}, h_L), and the deltas
    between consecutive ones (`Transformer.capture`): the ground truth a rebuild by `step_back`
    is measured against."""
    with model.capture() as stream:
        model(tokens)
    slots, deltas = [stream["residual"][0]], []
    for mid, h, delta0, delta1 in zip(
        stream["mid"], stream["residual"][1:], stream["attention"], stream["feed_forward"]
    ):
        slots += [mid, h]
        deltas += [delta0, delta1]
    return slots, deltas


def _storage_bytes(tensors) -> int:
    """Bytes of the distinct storages behind `tensors`."""
    storages = {storage_id(t): t.untyped_storage().nbytes() for t in tensors}
    return sum(storages.values())


class ReversibleStream(torch.autograd.graph.saved_tensors_hooks):
    """Saved-tensor hooks for one forward pass; `step(block, h, cos, sin)` runs one block.

    Slots number the stream's residuals in forward order: h_0, mid_0, h_1, mid_1, ..., h_L.
    After the forward pass, `stats` gives bytes kept for the backward pass as saved tensors
    (`kept_bytes`), as cached deltas (`delta_bytes`), and the residual bytes dropped
    (`dropped_bytes`), each counting distinct storages.
    """

    def __init__(self, bottom=None, rebuild_block=step_back_block):
        super().__init__(self._pack, self._unpack)
        self._bottom = bottom  # () -> h_0 recomputed (the embedding), or None to keep delta0_0
        self._rebuild_block = rebuild_block  # `step_back_block`, or its compiled version
        self._saved: list[_Saved] = []  # every tensor packed during the forward pass
        self._pending = 0  # self._saved[self._pending:] are not yet matched against residuals
        self._dropped: dict[int, int] = {}  # slot -> bytes of the residual dropped
        self._deltas: list[torch.Tensor | None] = []  # slot k + 1 = slot k + self._deltas[k]
        self._known: dict[int, torch.Tensor] = {}  # slot -> value, for the top and rebuilt slots
        self._uses: dict[int, int] = {}  # slot -> saved tensors still to be unpacked as it
        self.stats: dict[str, int] | None = None

    def step(self, block, h: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, live: bool = False):
        """Run `block` on `h`; returns its parts (out, mid, delta0, delta1), as `block(..., parts=True)`:
        mid and the deltas detached (they need no gradient: a compiled block would otherwise add a
        zero-filled one for each to its backward), unless `live` (a capture that wants their `.grad`)."""
        out, mid, delta0, delta1 = parts = block(h, cos, sin, parts=True if live else "detached")
        slot = len(self._deltas)
        self._drop({slot: h, slot + 1: mid})
        self._deltas += [None if slot == 0 and self._bottom else delta0.detach(), delta1.detach()]
        self._known = {slot + 2: out.detach()}
        return parts

    def __exit__(self, *exc):
        super().__exit__(*exc)
        self._drop({})
        kept = [s.tensor for s in self._saved if s.tensor is not None]
        self.stats = {
            "kept_bytes": _storage_bytes(kept),
            "delta_bytes": _storage_bytes([d for d in self._deltas if d is not None]),
            "dropped_bytes": sum(self._dropped.values()),
        }
        self._saved = []  # hold nothing past the forward pass that autograd does not hold

    def _pack(self, x: torch.Tensor) -> _Saved:
        saved = _Saved(x.detach())
        self._saved.append(saved)
        return saved

    def _unpack(self, saved: _Saved) -> torch.Tensor:
        if saved.slot is None:
            return saved.tensor
        value = self._rebuild(saved.slot)
        self._uses[saved.slot] -= 1
        self._forget()
        return value

    def _forget(self):
        """Hold a residual while a saved tensor is still to be unpacked as it, and the lowest one
        rebuilt until h_0 is done (the walk down starts from it); nothing else."""
        lowest = min(self._known)
        self._known = {k: v for k, v in self._known.items() if self._uses.get(k, 0) > 0 or 0 < k == lowest}

    def _drop(self, residuals: dict[int, torch.Tensor]):
        """Replace the pending saved tensors that are one of `residuals` by their slot."""
        for saved in self._saved[self._pending :]:
            for slot, residual in residuals.items():
                if _same_tensor(saved.tensor, residual):
                    saved.tensor, saved.slot = None, slot
                    self._dropped[slot] = residual.untyped_storage().nbytes()
                    self._uses[slot] = self._uses.get(slot, 0) + 1
                    break
        self._pending = len(self._saved)

    @torch.no_grad()
    def _rebuild(self, slot: int) -> torch.Tensor:
        """The residual of `slot`, walking down from the lowest one known (the slots passed on
        the way stay known while they have uses left: a compiled block unpacks its saved tensors
        in forward order, h_i then mid_i, eager autograd in backward order). From a block's output
        h_{i+1} (an even slot) both residuals below it are rebuilt at once (`step_back_block`),
        also when only mid_i is asked for: h_i is asked for next, by the same block's backward."""
        if slot not in self._known:
            lowest = min(self._known, default=-1)  # -1: everything down to h_0 was used up
            if slot > lowest:
                raise RuntimeError(
                    f"reversible stream: residual {slot} is needed after residual {lowest} below it "
                    "was rebuilt; it supports one backward pass per forward (no retain_graph)"
                )
            while lowest > slot:  # invariant: len(self._deltas) == lowest
                if lowest % 2 == 0 and self._deltas[-2] is not None:
                    delta1, delta0 = self._deltas.pop(), self._deltas.pop()
                    self._known[lowest - 1], self._known[lowest - 2] = self._rebuild_block(
                        self._known[lowest], delta1, delta0
                    )
                    lowest -= 2
                    continue
                delta = self._deltas.pop()
                self._known[lowest - 1] = self._bottom() if delta is None else step_back(self._known[lowest], delta)
                lowest -= 1
        return self._known[slot]


class SavedTensorBytes(torch.autograd.graph.saved_tensors_hooks):
    """Counts what autograd keeps for the backward pass inside the context: `nbytes`, over
    distinct storages (a measure of activation memory that needs no GPU). Nested hooks replace
    these, so for a reversible model read `Transformer.reversible_stats` instead."""

    def __init__(self):
        self._storages: dict[int, int] = {}
        super().__init__(self._pack, lambda x: x)

    def _pack(self, x: torch.Tensor) -> torch.Tensor:
        self._storages[storage_id(x)] = x.untyped_storage().nbytes()
        return x.detach()

    @property
    def nbytes(self) -> int:
        return sum(self._storages.values())
