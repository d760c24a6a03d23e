"""Which kernels run the model's bf16 matrix products and attention on the CPU.

bf16 compute means: every GEMM and the attention take bf16 inputs, accumulate in fp32 and round
their outputs to bf16. CPUs with native bf16 (AVX512-BF16 or AMX, where torch hands bf16 matmuls
to oneDNN) do exactly that. Elsewhere (AVX2 only, as most laptops; torch 2.13 then runs bf16
matmuls in a generic fallback many times slower than fp32) the same numbers come from fp32
kernels: the inputs are already bf16 values, so upcasting them is exact, a product of two bf16
values is exact in fp32, and the fp32 GEMM's result differs from a native bf16 GEMM's only in the
order of its fp32 summation; the output is rounded to bf16 as the native kernel rounds it. The
backward pass takes the same path through autograd (each gradient GEMM in fp32 on bf16 values,
rounded to bf16 by the casts' backward). So every tensor the sublayers hand on is bf16 on either
path. Attention is torch's fused fp32 kernel on the bf16 q, k, v with its output rounded: what a
flash kernel rounds inside (torch's CPU kernel rounds the probabilities to bf16 before they
multiply v and sums dk and dv over its query blocks in bf16; GPU kernels round otherwise) it
keeps in fp32, so its error against fp64 is at most the native kernel's, op by op, while the
whole model's gradients have native's error (test_compute.py; the figures: docs/measurements.md).
An emulation of the CPU kernel's inner roundings too (written and measured) brought the model's
gradient error no closer to native's, at a longer step time, so it is not kept.

torch offers no switch for this direction (its `float32_matmul_precision` and oneDNN's fpmath
mode make fp32 matmuls run in bf16, not the reverse; autocast picks bf16 kernels), hence the
casts. The choice is the config's `cpu_bf16`, an execution setting that reruns nothing. It is
decided once per process (`streamback.model.execution`: `cli.main` decides it from the job's
config before a stage runs and applies it around the stage) and applied with `use(...)`, which
gives the previous path back when its block ends: nothing one caller sets outlives it. A process
that decides nothing computes on `STREAMBACK_CPU_BF16`'s path, else `auto`'s:
- `auto` (default): fp32 kernels on a CPU where `torch.ops.mkldnn._is_mkldnn_bf16_supported()`
  is False (torch's own test of whether bf16 matmuls get native kernels; it honours
  `ONEDNN_MAX_CPU_ISA`, so `ONEDNN_MAX_CPU_ISA=AVX2 ATEN_CPU_CAPABILITY=avx2` makes a native
  machine behave as an AVX2 one, as `benchmarks/bench_cpu_bf16.py` does); native kernels on a
  CPU that has them, or wherever `STREAMBACK_FORCE_NATIVE_BF16=1` (slow without native kernels,
  but the same code path: the kernel-sensitive tests run under it on any CPU). Never on CUDA.
- `native` or `emulated`: that path on every CPU (CUDA always runs native bf16).
"""

from __future__ import annotations

import contextlib
import os

import torch
import torch.nn.functional as F

from streamback.errors import StreambackError

CPU_BF16_MODES = ("auto", "native", "emulated")
ENV = "STREAMBACK_CPU_BF16"
FORCE_NATIVE_ENV = "STREAMBACK_FORCE_NATIVE_BF16"  # "1": auto resolves to native on every CPU


def check_mode(mode: str, where: str) -> str:
    """`mode` if it is a CPU_BF16_MODES name, else a StreambackError naming `where`."""
    if mode not in CPU_BF16_MODES:
        raise StreambackError(f"{where}: {mode!r} is not one of {', '.join(CPU_BF16_MODES)}")
    return mode


def cpu_has_native_bf16() -> bool:
    """Whether torch runs this CPU's bf16 matmuls on native kernels (oneDNN with AVX512-BF16/AMX)."""
    return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())


def resolves_to_emulated(chosen: str) -> bool:
    """Whether the mode `chosen` computes bf16 on fp32 kernels on this CPU (auto: where torch has no
    native bf16 kernels and STREAMBACK_FORCE_NATIVE_BF16 is not 1)."""
    if chosen == "auto":
        return not (cpu_has_native_bf16() or os.environ.get(FORCE_NATIVE_ENV) == "1")
    return chosen == "emulated"


# The mode and what it resolves to: the environment's when the module is imported, then only
# `use`'s block's. A plain global, so that torch.compile reads it as a constant (guarded) and
# traces no call; `use` alone sets it, and gives the previous one back.
_mode = check_mode(os.environ.get(ENV) or "auto", f"environment variable {ENV}")
_emulated = resolves_to_emulated(_mode)


def mode() -> str:
    """The chosen mode (a CPU_BF16_MODES name)."""
    return _mode


def emulated() -> bool:
    """Whether bf16 compute on the CPU runs on fp32 kernels (see the module docstring)."""
    return _emulated


def path(device: torch.device | str = "cpu", dtype: torch.dtype = torch.bfloat16) -> str:
    """The kernels `dtype` compute runs on `device` with in this process now (see `kernels`)."""
    return kernels(_emulated, device, dtype)


def kernels(on_fp32: bool, device: torch.device | str = "cpu", dtype: torch.dtype = torch.bfloat16) -> str:
    """The kernels `dtype` compute runs on `device` with where bf16 on the CPU is emulated or not
    (`on_fp32`): 'bf16 on fp32 kernels', 'native bf16' or the dtype's name."""
    device = torch.device(device)
    if dtype != torch.bfloat16:
        return str(dtype).removeprefix("torch.")
    return "bf16 on fp32 kernels" if device.type == "cpu" and on_fp32 else "native bf16"


@contextlib.contextmanager
def use(chosen: str, where: str = "cpu_bf16", *, emulated: bool | None = None):
    """Run the block on the mode `chosen` (a CPU_BF16_MODES name; `where` names it in errors) and
    give the previous mode back after it. `emulated`: what `chosen` resolved to when the process
    decided it (streamback.model.execution), else resolved now."""
    global _mode, _emulated
    previous = _mode, _emulated
    chosen = check_mode(chosen, where)
    _mode, _emulated = chosen, resolves_to_emulated(chosen) if emulated is None else emulated
    try:
        yield
    finally:
        _mode, _emulated = previous


def _on_fp32(x: torch.Tensor) -> bool:
    return x.dtype == torch.bfloat16 and x.device.type == "cpu" and _emulated


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """x @ weight.T (+ bias) in x's dtype (the weight and bias cast to it); bf16 on the CPU by `emulated()`'s path."""
    weight = weight.to(x.dtype)
    bias = None if bias is None else bias.to(x.dtype)
    if _on_fp32(x):
        return F.linear(x.float(), weight.float(), None if bias is None else bias.float()).to(x.dtype)
    return F.linear(x, weight, bias)


def attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    is_causal: bool = False,
    attn_mask: torch.Tensor | None = None,
    scale: float | None = None,
) -> torch.Tensor:
    """F.scaled_dot_product_attention(q, k, v, ...) in q's dtype; bf16 on the CPU by `emulated()`'s
    path: torch's fused fp32 kernel on the bf16 q, k, v, its output (and, backward, each input's
    gradient) rounded to bf16."""
    if _on_fp32(q):
        return F.scaled_dot_product_attention(
            q.float(), k.float(), v.float(), attn_mask=attn_mask, is_causal=is_causal, scale=scale
        ).to(q.dtype)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, is_causal=is_causal, scale=scale)
