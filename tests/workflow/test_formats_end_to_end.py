"""The end-to-end half of test_formats.py (commands run as processes, compiled or multi-process runs, Snakemake): the same subjects, at the pace of whole runs."""

import pytest
import torch
from test_formats import _sr_inputs, _sr_verdict, _two_steps  # noqa: F401  (fixtures and helpers shared with the unit tests)

from streamback.model.formats import StreamFormat


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
    out = torch.compile(lambda *a: _two_steps(fmt, *a), fullgraph=True)(x, d, d16)
    assert out.dtype == fmt.container_dtype and fmt.is_representable(out)
    if fmt.rounding == "nearest":
        assert torch.equal(out, _two_steps(fmt, x, d, d16))
    else:
        h, exact = _sr_inputs(fmt, 4000, device)
        _sr_verdict(fmt, torch.compile(fmt.add, fullgraph=True)(h, exact), exact)
    torch._dynamo.reset()
