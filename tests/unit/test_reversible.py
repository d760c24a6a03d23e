"""The reversible stream: gradients against the plain model, rebuild error, memory saved (counted
with saved-tensor hooks), activation checkpointing, torch.compile, and its limits; the numerical
ones on every device (conftest's `device`).

Tolerance stated: with fp32 compute (where nothing rounds the small differences away) every
parameter's gradient is within 1e-5 of the plain model's, relative to its largest entry (measured:
about 1e-7; see benchmarks/reversible_error.py). Each rebuilt residual is within a few fp32 ulps
of the true one per step down the stream.
"""

import pytest
import torch

from streamback.model.reversible import SavedTensorBytes, forward_residuals, step_back, step_back_block
from streamback.model.rounding import FP32, ulp
from streamback.train.parallel import apply_activation_checkpointing, apply_compile

from helpers.reversible import LAYERS, N, assert_grads_close, batch, loss, pair


def test_reversible_gradients_match_the_plain_model(device):
    plain, twin = pair(device=device)
    tok = batch(device=device)
    loss(plain, tok).backward()
    loss(twin, tok).backward()
    assert_grads_close(plain, twin)
    # the residuals really were rebuilt: every one was dropped on the forward pass
    assert twin.reversible_stats["dropped_bytes"] == 2 * LAYERS * N * 4


def test_reversible_in_bf16_compute(device):
    plain, twin = pair(torch.bfloat16, device=device)
    tok = batch(1, device)
    # exact
    torch.testing.assert_close(loss(plain, tok), loss(twin, tok), rtol=0, atol=0)  # forward untouched
    loss(plain, tok).backward()
    loss(twin, tok).backward()
    # derived: a flipped bf16 rounding moves an entry by up to 2^-8 of it (4e-3); 1e-2 of the largest entry holds 2.5
    # such
    assert_grads_close(plain, twin, rtol=1e-2)  # a 1-ulp fp32 change can flip one bf16 rounding


def test_rebuild_error_per_layer(device):
    """h_i rebuilt from h_L by subtracting deltas: within 2 fp32 ulps (of max|h|) per step."""
    plain, _ = pair(layers=8, device=device)
    tok = batch(device=device)[:, :-1]
    slots, deltas = forward_residuals(plain, tok)
    value = slots[-1]
    inexact = 0
    for k in range(len(deltas) - 1, -1, -1):
        value = step_back(value, deltas[k])
        steps = len(deltas) - k
        spacing = ulp(slots[k].abs().max().reshape(1), FP32).item()
        assert (value - slots[k]).abs().max().item() <= 2 * steps * spacing
        inexact += int(not torch.equal(value, slots[k]))
    assert inexact > 0  # fp32 subtraction does not undo fp32 addition exactly


def test_memory_saved_counts():
    """Per layer the two fp32 residuals (2 x 4 bytes) are replaced by two bf16 deltas (2 x 2),
    except the first delta: h_0 is recomputed from the tokens."""
    plain, twin = pair(torch.bfloat16)
    tok = batch()[:, :-1]
    counter = SavedTensorBytes()
    with counter:
        plain(tok)
    twin(tok)
    stats = twin.reversible_stats
    assert stats["dropped_bytes"] == 2 * LAYERS * N * 4
    assert stats["delta_bytes"] == (2 * LAYERS - 1) * N * 2
    assert stats["kept_bytes"] + stats["dropped_bytes"] == counter.nbytes  # the same saved tensors
    assert counter.nbytes - (stats["kept_bytes"] + stats["delta_bytes"]) == LAYERS * N * 4 + N * 2


def test_reversible_with_activation_checkpointing(device):
    """Checkpointing saves each block's input only; the reversible stream drops and rebuilds it."""
    plain, twin = pair(device=device)
    for model in (plain, twin):
        apply_activation_checkpointing(model)
    tok = batch(device=device)
    loss(plain, tok).backward()
    loss(twin, tok).backward()
    assert_grads_close(plain, twin)
    assert twin.reversible_stats["dropped_bytes"] == LAYERS * N * 4


def test_a_second_backward_is_refused():
    _, twin = pair(layers=2)
    out = loss(twin, batch())
    out.backward(retain_graph=True)
    with pytest.raises(RuntimeError, match="one backward pass per forward"):
        out.backward()


def test_no_hooks_without_grad():
    _, twin = pair(layers=2)
    twin.reversible_stats = None
    with torch.no_grad():
        twin(batch()[:, :-1])
    assert twin.reversible_stats is None


def test_bottom_residual_is_recomputed_from_the_tokens(monkeypatch):
    """h_0 is the embedding: the backward pass recomputes it (once, exactly) instead of keeping
    the first delta, so gradients still match and one bf16 delta fewer is kept."""
    plain, twin = pair(layers=2)
    calls = []
    embed = twin.embed
    monkeypatch.setattr(twin, "embed", lambda tokens: calls.append(tokens.shape) or embed(tokens))
    tok = batch()
    out = loss(twin, tok)
    assert len(calls) == 1 and twin.reversible_stats["delta_bytes"] == 3 * N * 4  # fp32 compute: fp32 deltas
    out.backward()
    assert len(calls) == 2
    loss(plain, tok).backward()
    assert_grads_close(plain, twin)


def test_a_block_is_rebuilt_in_one_step_bit_for_bit(device):
    """step_back_block (both residuals of a block from its output) is step_back twice, compiled
    (apply_compile's, one kernel) or not."""
    plain, _ = pair(layers=2, device=device)
    slots, deltas = forward_residuals(plain, batch(device=device)[:, :-1])
    top, delta1, delta0 = slots[4], deltas[3], deltas[2]
    expected = step_back(step_back(top, delta1), delta0)
    for rebuild in (step_back_block, torch.compile(step_back_block, dynamic=False)):
        mid, h = rebuild(top, delta1, delta0)
        assert torch.equal(mid, step_back(top, delta1)) and torch.equal(h, expected)
    torch._dynamo.reset()


def test_compiled_blocks_take_no_gradient_for_their_parts():
    """The reversible stream needs a compiled block's mid residual and deltas but no gradient of
    them: the block returns them detached, so AOT autograd materialises no zero gradient for
    each (3 per layer, then added into the backward). Counted at dispatch during the backward."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Zeros(TorchDispatchMode):
        count = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            Zeros.count += func in (torch.ops.aten.zeros.default, torch.ops.aten.zeros_like.default)
            return func(*args, **(kwargs or {}))

    plain, twin = pair(layers=3)
    for model in (plain, twin):
        apply_compile(model, backend="aot_eager_decomp_partition")  # AOT autograd and its partitioner, no codegen
    tok = batch()
    for model in (plain, twin):
        out = loss(model, tok)
        with Zeros():
            out.backward()
    assert Zeros.count == 0
    assert_grads_close(plain, twin)
    torch._dynamo.reset()
