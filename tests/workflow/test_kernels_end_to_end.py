"""The end-to-end half of test_kernels.py (commands run as processes, compiled or multi-process runs, Snakemake): the
same subjects, at the pace of whole runs."""

import torch

from streamback.measure import kernels


def test_generated_kernels_of_a_compiled_function():
    """A pointwise chain and a row sum fuse into one kernel; the matmul is a library call."""
    weight = torch.randn(16, 8)

    def step(x):
        return (x.sin() * 2 + 1).sum(-1), x @ weight

    x = torch.randn(4, 16)
    (total, product), graphs = kernels.generated_kernels(lambda: torch.compile(step)(x))
    # derived: a fused kernel and eager sum 16 fp32 terms in other orders (gamma_16 = 1e-6 of the sum of |terms|);
    # fp32's default rtol 1.3e-6, atol 1e-5
    torch.testing.assert_close(total, (x.sin() * 2 + 1).sum(-1))
    assert len(graphs) == 1 and graphs[0]["extern"] == ["mm"]
    names = [name for name, _ in graphs[0]["kernels"]]
    assert len(names) == 1 and names[0].startswith("cpp_fused_") and {"sin", "sum"} <= set(names[0].split("_"))
    assert kernels.graph_summary(graphs[0]) == "1 kernels (cpp 1); 1 library calls"
    torch._dynamo.reset()
