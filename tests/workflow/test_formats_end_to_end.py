"""The end-to-end half of test_formats.py (commands run as processes, compiled or multi-process runs, Snakemake): the
same subjects, at the pace of whole runs."""

import pytest
import torch

from streamback.model.formats import StreamFormat

from helpers.formats import ALL, sr_inputs, sr_verdict, two_steps


@pytest.mark.slow
@pytest.mark.parametrize("label", ["bf16", "fp8_e4m3_sr", "mxfp8", "nvfp4", "nvfp4_sr"])
def test_add_dtype_compiled_inductor(label, device):
    """Inductor keeps the container dtype and the grid (one format per code path), a compiled
    nearest stream equals the eager one bit for bit (every intermediate sum is rounded), and a
    compiled stochastic one is unbiased (Inductor draws its own random bits)."""
    fmt = StreamFormat.parse(label)
    torch._dynamo.reset()
    x, d = (torch.randn(2, 3, 40) * 4).to(device), torch.randn(2, 3, 40).to(device)
    d16 = torch.randn(2, 3, 40).bfloat16().to(device)
    out = torch.compile(lambda *a: two_steps(fmt, *a), fullgraph=True)(x, d, d16)
    assert out.dtype == fmt.container_dtype and fmt.is_representable(out)
    if fmt.rounding == "nearest":
        assert torch.equal(out, two_steps(fmt, x, d, d16))
    else:
        h, exact = sr_inputs(fmt, 4000, device)
        sr_verdict(fmt, torch.compile(fmt.add, fullgraph=True)(h, exact), exact)
    torch._dynamo.reset()


@pytest.mark.slow
def test_add_dtype_traced_fullgraph_with_backward():
    """Dynamo traces enter/add of every format in one graph (no graph breaks, the compile-time
    code path), forward and backward; Inductor itself is exercised per code path below."""
    torch._dynamo.reset()
    x = torch.randn(2, 40, requires_grad=True)
    d = torch.randn(2, 40, requires_grad=True)
    d16 = torch.randn(2, 40, dtype=torch.bfloat16, requires_grad=True)
    step = torch.compile(lambda x, d, d16: [two_steps(f, x, d, d16) for f in ALL], backend="eager", fullgraph=True)
    outs = step(x, d, d16)
    for fmt, out in zip(ALL, outs):
        assert out.dtype == fmt.container_dtype and fmt.is_representable(out), fmt.label
    sum(o.float().sum() for o in outs).backward()
    for grad in (x.grad, d.grad, d16.grad):
        assert torch.equal(grad.float(), torch.full(grad.shape, float(len(ALL))))
