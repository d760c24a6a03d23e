"""The end-to-end half of test_reversible.py (commands run as processes, compiled or multi-process runs, Snakemake): the
same subjects, at the pace of whole runs."""

import pytest
import torch

from streamback.train.parallel import apply_compile

from helpers.reversible import LAYERS, N, assert_grads_close, batch, loss, pair


@pytest.mark.slow
def test_reversible_compiled(device):
    """Per-block torch.compile (inductor, bf16 compute): the compiled residuals still pass through
    the hooks and are all dropped; the forward pass is the eager one bit for bit (apply_compile's
    emulate_precision_casts; without it inductor skips bf16 roundings) and gradients match."""
    plain, twin = pair(torch.bfloat16, device=device)
    apply_compile(twin)
    tok = batch(device=device)
    plain_loss, twin_loss = loss(plain, tok), loss(twin, tok)
    assert torch.equal(plain_loss, twin_loss)
    plain_loss.backward()
    twin_loss.backward()
    # derived: as test_reversible_in_bf16_compute: a flipped bf16 rounding is 2^-8 of an entry; 1e-2 holds 2.5 such
    assert_grads_close(plain, twin, rtol=1e-2)
    assert twin.reversible_stats["dropped_bytes"] == 2 * LAYERS * N * 4
    torch._dynamo.reset()
