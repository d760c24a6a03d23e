"""Which kernels run the model's bf16 matrix products and attention on the CPU.

bf16 compute means: every GEMM and the attention take bf16 inputs, accumulate in fp32 and round
their outputs to bf16. CPUs with native bf16 (AVX512-BF16 or AMX, where torch hands bf16 matmuls
to oneDNN) do exactly that. Elsewhere (AVX2 only, as most laptops; torch 2.13 then runs bf16
matmuls in a generic fallback about 25x slower than fp32) the same numbers come from fp32
kernels: the inputs are already bf16 values, so upcasting them is exact, a product of two bf16
values is exact in fp32, and the fp32 GEMM's result differs from a native bf16 GEMM's only in the
order of its fp32 summation; the output is rounded to bf16 as the native kernel rounds it. The
attention rounds where the native (flash) kernels round, on CPU and GPU alike: its fp32 scores
and softmax, the probabilities rounded to bf16 before they multiply v (see `attention`). The backward pass takes
the same path through autograd (each gradient GEMM in fp32 on bf16 values, rounded to bf16 by
the casts' backward). So every tensor the sublayers hand on is bf16 on either path.

torch offers no switch for this direction (its `float32_matmul_precision` and oneDNN's fpmath
mode make fp32 matmuls run in bf16, not the reverse; autocast picks bf16 kernels), hence the
casts. The choice (`STREAMBACK_CPU_BF16`, or `use(...)` in a process; the workflow sets it from
the config's `cpu_bf16`, an execution setting that reruns nothing):
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

import torch
import torch.nn.functional as F

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


@contextlib.contextmanager
def use(chosen: str):
    """Run the block with `chosen` (a CPU_BF16_MODES name) as the mode, whatever the environment says."""
    global _mode, _emulated
    previous = _mode, _emulated
    _mode, _emulated = _check(chosen, "cpu_bf16"), _resolve(chosen)
    try:
        yield
    finally:
        _mode, _emulated = previous


def _on_fp32(x: torch.Tensor) -> bool:
    return x.dtype == torch.bfloat16 and x.device.type == "cpu" and _emulated


def linear(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """x @ weight.T in x's dtype (the weight cast to it), bias-free; bf16 on the CPU by `emulated()`'s path."""
    weight = weight.to(x.dtype)
    if _on_fp32(x):
        return F.linear(x.float(), weight.float()).to(x.dtype)
    return F.linear(x, weight)


def _scores(q, k, scale, is_causal, attn_mask, first: int):
    """fp32 scale * q k^T of the queries from row `first` on, the masks applied (-inf where a key is masked)."""
    scores = (q.float() @ k.float().transpose(-2, -1)) * scale
    if is_causal:  # top-left aligned, as SDPA's is_causal
        causal = torch.ones(q.shape[-2], k.shape[-2], dtype=torch.bool, device=q.device).tril(first)
        scores = scores.masked_fill(~causal, float("-inf"))
    if attn_mask is not None:
        scores = scores.masked_fill(~attn_mask, float("-inf")) if attn_mask.dtype == torch.bool else scores + attn_mask.float()
    return scores


def _query_block(length: int) -> int:
    """The CPU flash kernel's query block (torch 2.x, FlashAttentionKernel.cpp): 256 rows from 768
    queries, 64 from 192, else 32."""
    return 256 if length >= 768 else 64 if length >= 192 else 32


class _AttentionOnFP32(torch.autograd.Function):
    """Attention on fp32 kernels with the native CPU flash kernel's bf16 roundings, forward and backward.

    Forward: fp32 scores s, the probabilities' numerators exp(s - row max) rounded to bf16 before
    they multiply v, the fp32 sum of the exponentials dividing the product, the output rounded.
    Backward, a query block at a time as that kernel goes: the probabilities p = exp(s -
    logsumexp) recomputed and rounded to bf16 for dv += p^T do; dp = do v^T in fp32; ds = p (dp -
    rowsum(do * o)) rounded to bf16 for dq = ds k and dk += ds^T q (times the scale); dq rounded
    once, dk and dv accumulated over the query blocks in bf16, as the CPU kernel accumulates them
    (measured: its dk and dv errors against fp64 are this emulation's, 3.6e-3, where accumulating
    in fp32 gives 2.5e-3; GPU flash kernels accumulate them in fp32). Saves what the native
    kernel saves: q, k, v, the output and the fp32 logsumexp.
    """

    @staticmethod
    def forward(ctx, q, k, v, scale, is_causal, attn_mask):
        scores = _scores(q, k, scale, is_causal, attn_mask, 0)
        top = scores.amax(-1, keepdim=True)
        weights = torch.exp(scores - top)
        total = weights.sum(-1, keepdim=True)
        out = ((weights.to(q.dtype).float() @ v.float()) / total).to(q.dtype)
        ctx.save_for_backward(q, k, v, out, top + total.log(), attn_mask)
        ctx.scale, ctx.is_causal = scale, is_causal
        return out

    @staticmethod
    def backward(ctx, grad_out):
        q, k, v, out, logsumexp, attn_mask = ctx.saved_tensors
        kf, vf, dtype = k.float(), v.float(), q.dtype
        grad_q = torch.empty_like(q)
        grad_k, grad_v = torch.zeros_like(k), torch.zeros_like(v)
        block = _query_block(q.shape[-2])
        for first in range(0, q.shape[-2], block):
            rows = slice(first, first + block)
            mask = None if attn_mask is None else attn_mask[..., rows, :]
            probs = torch.exp(_scores(q[..., rows, :], k, ctx.scale, ctx.is_causal, mask, first) - logsumexp[..., rows, :])
            do = grad_out[..., rows, :].to(dtype).float()
            grad_v = (grad_v.float() + probs.to(dtype).float().transpose(-2, -1) @ do).to(dtype)
            rowdot = (do * out[..., rows, :].float()).sum(-1, keepdim=True)
            grad_scores = (probs * (do @ vf.transpose(-2, -1) - rowdot)).to(dtype).float()
            grad_q[..., rows, :] = ((grad_scores @ kf) * ctx.scale).to(dtype)
            grad_k = (grad_k.float() + (grad_scores.transpose(-2, -1) @ q[..., rows, :].float()) * ctx.scale).to(dtype)
        return grad_q, grad_k, grad_v, None, None, None


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, is_causal: bool = False,
              attn_mask: torch.Tensor | None = None, scale: float | None = None) -> torch.Tensor:
    """F.scaled_dot_product_attention(q, k, v, ...) in q's dtype ([..., L, E]); bf16 on the CPU by
    `emulated()`'s path (`_AttentionOnFP32`: with one key block, as the CPU kernel has for up to
    512 keys, its running max is the row max, so the roundings fall where that kernel's do)."""
    if not _on_fp32(q):
        return F.scaled_dot_product_attention(q, k, v, attn_mask, is_causal=is_causal, scale=scale)
    return _AttentionOnFP32.apply(q, k, v, q.shape[-1] ** -0.5 if scale is None else scale, is_causal, attn_mask)
