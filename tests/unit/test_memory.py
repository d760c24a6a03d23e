"""The peak-memory estimate (`streamback memory`): against the CPU allocator's own accounting of a
real step, and the stream's cost in bytes computed by hand."""

import gc

import pytest
import torch
import torch.nn.functional as F

from streamback.cli import main as cli_main
from streamback.measure.memory import estimate_step_memory
from streamback.model.model import ModelArgs, Transformer

B, T = 2, 64
VARIANTS = [dict(block="baseline"), dict(block="streamback"), dict(block="streamback", reversible=True)]


def tiny(**kw):
    return ModelArgs(dim=128, n_layers=3, n_heads=4, n_kv_heads=1, vocab_size=512, multiple_of=32, **kw)


def allocator_peak(args: ModelArgs) -> tuple[int, int]:
    """Peak bytes above the start that the CPU allocator reports (profiler memory events) over a
    real forward + backward on native bf16 kernels (the step the estimate models: a GPU's; bf16 on
    fp32 kernels, which an AVX2 CPU takes, holds fp32 copies besides), and the bytes of the model
    and tokens that existed before it."""
    from torch.profiler import ProfilerActivity, profile

    from streamback.model import compute

    model = Transformer(args)
    tokens = torch.randint(0, args.vocab_size, (B, T + 1))
    gc.collect()
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof, compute.use("native"):
        F.cross_entropy(model(tokens[:, :-1]).flatten(0, 1), tokens[:, 1:].flatten()).backward()
    # every allocation and free, in order (kineto's raw events: FunctionEvents leave them out)
    events = sorted(
        (e for e in prof.profiler.kineto_results.events() if e.name() == "[memory]"), key=lambda e: e.start_ns()
    )
    current = peak = 0
    for event in events:
        current += event.nbytes()
        peak = max(peak, current)
    existing = sum(t.nbytes for t in [*model.parameters(), *model.buffers(), tokens])
    return peak, existing


@pytest.mark.parametrize("variant", VARIANTS, ids=lambda v: "-".join(map(str, v.values())))
def test_estimate_equals_the_cpu_allocators_peak(variant):
    """Fake tensors, no arithmetic: the same peak, to the byte, as a real step's allocations."""
    args = tiny(**variant)
    estimate = estimate_step_memory(args, B, T)
    peak, existing = allocator_peak(args)
    assert estimate["peak"] == existing + peak
    assert estimate["params"] == sum(p.numel() * 4 for p in Transformer(args).parameters())


def test_stream_costs_by_hand():
    """fp32 stream: 2 more bytes per element for each of the 2 L + 1 residuals autograd keeps (the
    norms' inputs); the reversible stream keeps what the baseline keeps (bf16 deltas for the
    residuals, the embedding recomputed, the top residual in fp32): the same peak."""
    base, fp32, reversible = (estimate_step_memory(tiny(**v), B, T) for v in VARIANTS)
    n = B * T * 128
    assert fp32["peak"] - base["peak"] == (2 * 3 + 1) * n * 2
    assert reversible["peak"] == base["peak"]
    assert base["grads"] == 0  # the peak comes before the weights' gradients: at the loss


def test_memory_cli_refuses_bad_arguments(tmp_path):
    out = tmp_path / "m.json"
    assert cli_main(["memory", "--shapes", "gigantic", "--out", str(out)]) == 2
    assert cli_main(["memory", "--variants", "baseline,fp64", "--out", str(out)]) == 2
    assert cli_main(["memory", "--batch", "0", "--out", str(out)]) == 2
    assert not out.exists()
