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
casts. The choice is the config's `cpu_bf16`, an execution setting that reruns nothing: a stage
reads it as its workflow job does (`choose_for_stage`: `--cpu-bf16`, which the rules pass, else
the config file the stage reads); a process without a config takes `STREAMBACK_CPU_BF16`, or
`use(...)` around a block:
- `auto` (default): fp32 kernels on a CPU where `torch.ops.mkldnn._is_mkldnn_bf16_supported()`
  is False (torch's own test of whether bf16 matmuls get native kernels; it honours
  `ONEDNN_MAX_CPU_ISA`, so `ONEDNN_MAX_CPU_ISA=AVX2 ATEN_CPU_CAPABILITY=avx2` makes a native
  machine behave as an AVX2 one, as `benchmarks/bench_cpu_bf16.py` does); native kernels on a
  CPU that has them. Never on CUDA.
- `native` or `emulated`: that path on every CPU (CUDA always runs native bf16).
"""

from __future__ import annotations

import contextlib
import os
import sys

import torch
import torch.nn.functional as F

from streamback.config import DEFAULT_CONFIG, read_config_file, validate_config
from streamback.errors import StreambackError

CPU_BF16_MODES = ("auto", "native", "emulated")
ENV = "STREAMBACK_CPU_BF16"


def _check(mode: str, where: str) -> str:
    if mode not in CPU_BF16_MODES:
        raise StreambackError(f"{where}: {mode!r} is not one of {', '.join(CPU_BF16_MODES)}")
    return mode


def cpu_has_native_bf16() -> bool:
    """Whether torch runs this CPU's bf16 matmuls on native kernels (oneDNN with AVX512-BF16/AMX)."""
    return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())


def _resolve(chosen: str) -> bool:
    return chosen == "emulated" or (chosen == "auto" and not cpu_has_native_bf16())


# The mode and what it resolves to, fixed when the module is imported (the environment's) or by
# `use`: a plain global, so that torch.compile reads it as a constant (guarded) and traces no call.
_mode = _check(os.environ.get(ENV) or "auto", f"environment variable {ENV}")
_emulated = _resolve(_mode)


def mode() -> str:
    """The chosen mode (a CPU_BF16_MODES name)."""
    return _mode


def emulated() -> bool:
    """Whether bf16 compute on the CPU runs on fp32 kernels (see the module docstring)."""
    return _emulated


def path(device: torch.device | str = "cpu", dtype: torch.dtype = torch.bfloat16) -> str:
    """The kernels `dtype` compute runs on `device` with: 'bf16 on fp32 kernels', 'native bf16' or the dtype's name."""
    device = torch.device(device)
    if dtype != torch.bfloat16:
        return str(dtype).removeprefix("torch.")
    return "bf16 on fp32 kernels" if device.type == "cpu" and _emulated else "native bf16"


def set_mode(chosen: str, where: str = "cpu_bf16") -> None:
    """Make `chosen` (a CPU_BF16_MODES name) the mode of this process; `where` names it in errors."""
    global _mode, _emulated
    _mode, _emulated = _check(chosen, where), _resolve(chosen)


@contextlib.contextmanager
def use(chosen: str):
    """Run the block with `chosen` (a CPU_BF16_MODES name) as the mode, whatever the environment says."""
    previous = _mode
    set_mode(chosen)
    try:
        yield
    finally:
        set_mode(previous)


def add_argument(parser) -> None:
    """A stage's `--cpu-bf16` option (what the rules pass; see choose_for_stage)."""
    parser.add_argument(
        "--cpu-bf16",
        choices=CPU_BF16_MODES,
        default=None,
        help="how bf16 compute runs on the CPU (default: the cpu_bf16 of the config file the stage reads; "
        f"with --params, {ENV} or auto)",
    )


def choose_for_stage(args) -> str:
    """Set this process's mode from a stage's arguments as its workflow job gets it, and return it:
    `--cpu-bf16` (the rules pass the config's), else the `cpu_bf16` of the config file the stage
    reads (`--config`, or the default config when neither `--config` nor `--params` is given),
    else the environment's. A set STREAMBACK_CPU_BF16 that the choice overrides is named on stderr."""
    if args.cpu_bf16 is not None:
        chosen, source = args.cpu_bf16, "--cpu-bf16"
    elif getattr(args, "params", None) is None:
        path = args.config or DEFAULT_CONFIG
        chosen, source = validate_config(read_config_file(path))["cpu_bf16"], f"cpu_bf16 of {path}"
    else:
        return _mode
    env = os.environ.get(ENV)
    if env and env != chosen:
        print(f"warning: {ENV}={env} is ignored: {source} says {chosen}", file=sys.stderr)
    set_mode(chosen, source)
    return chosen


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
