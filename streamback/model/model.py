"""The Llama 3 decoder of the paper, with the residual stream in a chosen format.

TorchTitan's Llama 3 (the paper's reference implementation): token embedding, `n_layers` blocks
of RMSNorm -> grouped-query attention with RoPE -> residual add -> RMSNorm -> SwiGLU -> residual
add, a final RMSNorm and an untied output projection; parameter names are TorchTitan's, so its
state-dict conversions (e.g. to Hugging Face, `streamback.model.export_hf`) apply unchanged.

Two blocks, one class. What differs is only the format of the residual stream `h`, the
accumulator every sublayer adds its output to:
- `baseline`: `h` has the compute dtype (bf16), as in TorchTitan under FSDP2's bf16 params.
- `streamback`: `h` is held in `ModelArgs.stream` (a `streamback.model.formats.StreamFormat`, fp32 by
  default) from right after the embedding to the final norm. Each sublayer reads its input
  through its RMSNorm, whose output is cast to the compute dtype; its bf16 output (the "delta")
  is added with `fmt.add(h, delta)`, which adds in fp32 and rounds the sum to the format.
The baseline is the same code with `fmt` = the compute dtype (`fmt.add` is then plain `h + delta`
in bf16), so a streamback model with a `bf16` stream computes exactly what the baseline does.

Compute dtype. Master weights are fp32; every matmul, the attention and the norms' outputs run in
`compute_dtype` (bf16 by default). The model casts each weight to the compute dtype where it
uses it (`w.to(dtype)`): a no-op under FSDP2 with `param_dtype=bf16` (the weight already is
bf16), and otherwise the same rounding FSDP2 would apply, with gradients flowing back to the
fp32 master through the cast. So eager, `torch.compile` and FSDP2 runs compute the same thing
with the same roundings (inductor needs `emulate_precision_casts`, which
`streamback.train.parallel.apply_compile` sets; what remains between eager and compiled is the
last-bit noise of fp32 reductions and transcendentals evaluated in another order, which now and
then flips one bf16 rounding), and nothing relies on autocast or on FSDP2 casting
forward inputs (which would cast an fp32 stream to bf16; `apply_fsdp` turns that cast off). RMSNorm computes in fp32
whatever the stream's dtype (as torch's fused rms_norm does) and rounds once, to the compute
dtype; RoPE is applied in fp32 (as TorchTitan does); logits are returned in fp32. An fp64 compute
dtype (with the `fp64` stream) is the analyses' ground truth: every step then runs in fp64.

Choices the paper leaves open (also documented in config/config.yaml and the schema):
- RoPE: theta 500000, no Llama 3.1 frequency scaling (TorchTitan's current flavours apply it;
  it only rescales frequencies whose wavelength exceeds 8192 positions, i.e. less than a
  quarter turn over a 2048-token context). Pairs are interleaved (TorchTitan's complex-number
  convention, computed with real cos/sin); the HF export permutes wq/wk for HF's rotate_half.
- head_dim = dim // n_heads, so for 1512 / 16 = 94 the query width is 16 * 94 = 1504 != dim.
- SwiGLU hidden = multiple_of * ceil(int(ffn_dim_multiplier * int(2 * 4 * dim / 3)) / multiple_of).
- Init: TorchTitan's `depth_init=True`: wq, wk, wv, w1 ~ trunc_normal(0.02); wo, w2, w3 ~
  trunc_normal(0.02 / sqrt(2 * (layer_id + 1))) (truncated at +-2, i.e. not at all); embedding
  ~ N(0, embedding_init_std^2) (TorchTitan's 1 by default); output ~ trunc_normal(dim**-0.5, cut
  at 3 sigma); norm gains 1. With tied embeddings (off by default; TorchTitan's Llama 3 has none)
  the shared matrix gets the output projection's init (and embedding_init_std must stay 1).
- The embedding's std is the dose of the dose tier (config/dose.yaml): every sublayer reads the
  stream through RMSNorm, so scaling h_0 by s leaves the first updates as they were while the
  stream, and its bf16 grid step, grow s-fold: the same draws, times s.
- Causal attention through F.scaled_dot_product_attention(is_causal=True), no dropout, no biases.

Options for imported public models (`streamback.model.import_hf`), all off for the study's shapes
(whose parameters, state-dict keys and bits they leave as they were): an explicit head_dim,
q/k/v biases (Qwen2), an RMSNorm over each head of q and k before RoPE (Qwen3), and Llama 3.1's
RoPE frequency scaling.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from streamback.errors import StreambackError
from streamback.model import compute
from streamback.model.capture import STREAM_POINTS, StreamCapture
from streamback.model.formats import StreamFormat
from streamback.model.reversible import ReversibleStream, step_back_block
from streamback.runs import shape_problems
from streamback.sizes import ffn_hidden_dim

BLOCKS = ("baseline", "streamback")
ROPE_SCALING_KEYS = ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings")
_DTYPE_FORMAT = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16", torch.float64: "fp64"}


@dataclass
class ModelArgs:
    """Everything that fixes the model's architecture (saved with every checkpoint)."""

    dim: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    vocab_size: int
    multiple_of: int = 256
    ffn_dim_multiplier: float | None = None
    norm_eps: float = 1e-5
    rope_theta: float = 500000.0
    max_seq_len: int = 2048
    tied_embeddings: bool = False
    embedding_init_std: float = 1.0  # the embedding's initial std (TorchTitan's 1; model.embedding_init_std)
    block: str = "baseline"  # "baseline" | "streamback"
    stream: str = "fp32"  # StreamFormat text for the streamback block; the baseline's is its compute dtype's
    reversible: bool = False  # streamback with an fp32 stream only (streamback.model.reversible)
    # options of imported public models (`streamback.model.import_hf`); off, the study's model is unchanged
    attention_head_dim: int | None = None  # None: dim // n_heads
    qkv_bias: bool = False  # biases on wq, wk, wv (Qwen2)
    qk_norm: bool = False  # an RMSNorm over each head of q and of k, before RoPE (Qwen3)
    rope_scaling: dict | None = (
        # Llama 3.1's frequency scaling: {factor, low_freq_factor, high_freq_factor,
        # original_max_position_embeddings}
        None
    )

    def __post_init__(self):
        for key in ("dim", "n_layers", "n_heads", "n_kv_heads", "vocab_size", "multiple_of", "max_seq_len"):
            if not isinstance(getattr(self, key), int) or getattr(self, key) < 1:
                raise StreambackError(f"model {key} must be a positive integer, got {getattr(self, key)!r}")
        if self.block not in BLOCKS:
            raise StreambackError(f"model block {self.block!r} is not one of {', '.join(BLOCKS)}")
        problems = shape_problems(self.dim, self.n_heads, self.n_kv_heads, self.attention_head_dim)
        if self.rope_scaling is not None and set(self.rope_scaling) != set(ROPE_SCALING_KEYS):
            problems.append(
                f"rope_scaling must have exactly the keys {', '.join(ROPE_SCALING_KEYS)} (Llama 3.1's), got "
                f"{sorted(self.rope_scaling)}"
            )
        if not isinstance(self.embedding_init_std, (int, float)) or not self.embedding_init_std > 0:
            problems.append(f"embedding_init_std must be a positive number, got {self.embedding_init_std!r}")
        elif self.tied_embeddings and self.embedding_init_std != 1.0:
            problems.append(
                f"embedding_init_std {self.embedding_init_std} has no effect with tied embeddings (the shared "
                "matrix gets the output projection's init): leave it at 1 or untie the embeddings"
            )
        if problems:
            raise StreambackError("model: " + "; ".join(problems))
        fmt = StreamFormat.parse(self.stream)
        if self.reversible and (self.block != "streamback" or fmt.name != "fp32"):
            raise StreambackError(
                "the reversible stream needs the streamback block with an fp32 stream "
                f"(got block {self.block!r}, stream {self.stream!r}): narrower streams are no larger "
                "than the bf16 deltas they would be rebuilt from, and their rounding is not invertible"
            )

    def stream_format(self, compute_dtype: torch.dtype = torch.bfloat16) -> StreamFormat:
        """The stream this model keeps: `stream` for the streamback block, the compute dtype's for the baseline."""
        if self.block == "streamback":
            return StreamFormat.parse(self.stream)
        if compute_dtype not in _DTYPE_FORMAT:
            raise StreambackError(f"compute dtype must be one of {list(_DTYPE_FORMAT)}, got {compute_dtype}")
        return StreamFormat.parse(_DTYPE_FORMAT[compute_dtype])

    @property
    def head_dim(self) -> int:
        return self.attention_head_dim or self.dim // self.n_heads

    @property
    def ffn_hidden_dim(self) -> int:
        return ffn_hidden_dim(self.dim, self.multiple_of, self.ffn_dim_multiplier)

    @classmethod
    def from_config(
        cls,
        model_cfg: dict,
        shape: str,
        vocab_size: int,
        block: str = "baseline",
        stream: str = "fp32",
        reversible: bool = False,
    ) -> ModelArgs:
        """Arguments for the named `shape` of the validated `model` config section."""
        shapes = model_cfg["shapes"]
        if shape not in shapes:
            raise StreambackError(f"unknown model shape {shape!r}: config model.shapes has {', '.join(shapes)}")
        s = shapes[shape]
        return cls(
            dim=s["dim"],
            n_layers=s["n_layers"],
            n_heads=s["n_heads"],
            n_kv_heads=s["n_kv_heads"],
            vocab_size=vocab_size,
            multiple_of=s.get("multiple_of", model_cfg["multiple_of"]),
            ffn_dim_multiplier=model_cfg["ffn_dim_multiplier"],
            norm_eps=model_cfg["norm_eps"],
            rope_theta=float(model_cfg["rope_theta"]),
            max_seq_len=model_cfg["max_seq_len"],
            tied_embeddings=model_cfg["tied_embeddings"],
            embedding_init_std=float(s.get("embedding_init_std", model_cfg["embedding_init_std"])),
            block=block,
            stream=stream,
            reversible=reversible,
        )


class _RMSNormFunction(torch.autograd.Function):
    """y = x / rms(x) * w computed in fp32, rounded once to `dtype`. Saves only x, 1/rms and w.

    Written out so that the one full-size tensor kept for the backward pass is the input x
    itself, i.e. the residual stream (which the reversible stream can then drop and rebuild).
    """

    @staticmethod
    def forward(ctx, x, weight, eps, dtype):
        acc = torch.promote_types(x.dtype, torch.float32)  # fp32 (fp64 for fp64 inputs)
        xa = x.to(acc)
        rstd = torch.rsqrt(xa.pow(2).mean(-1, keepdim=True) + eps)
        ctx.save_for_backward(x, rstd, weight)
        return (xa * rstd * weight.to(acc)).to(dtype)

    @staticmethod
    def backward(ctx, grad):
        x, rstd, weight = ctx.saved_tensors
        xhat = x.to(rstd.dtype) * rstd
        g = grad.to(rstd.dtype)
        gw = g * weight.to(rstd.dtype)
        grad_x = rstd * (gw - xhat * (gw * xhat).mean(-1, keepdim=True))
        grad_w = (g * xhat).flatten(0, -2).sum(0)
        return grad_x.to(x.dtype), grad_w.to(weight.dtype), None, None


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        return _RMSNormFunction.apply(x, self.weight.to(dtype), self.eps, dtype)

    def reset_parameters(self):
        nn.init.ones_(self.weight)


class Linear(nn.Linear):
    """A linear layer computing in its input's dtype (the weight, and a bias if any, cast to it); bias-free by
    default."""

    def __init__(self, in_features: int, out_features: int, bias: bool = False):
        super().__init__(in_features, out_features, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return compute.linear(x, self.weight, self.bias)


def _llama3_scaled(freqs: torch.Tensor, scaling: dict) -> torch.Tensor:
    """Llama 3.1's RoPE frequencies: long wavelengths divided by `factor`, those between the two
    thresholds interpolated; fp32, the operations of transformers' `_compute_llama3_parameters`."""
    factor, low, high = scaling["factor"], scaling["low_freq_factor"], scaling["high_freq_factor"]
    old_context = scaling["original_max_position_embeddings"]
    low_wavelen, high_wavelen = old_context / low, old_context / high
    wavelen = 2 * math.pi / freqs
    scaled = torch.where(wavelen > low_wavelen, freqs / factor, freqs)
    smooth = (old_context / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = ~(wavelen < high_wavelen) * ~(wavelen > low_wavelen)
    return torch.where(medium, smoothed, scaled)


def rope_tables(
    head_dim: int, max_seq_len: int, theta: float, scaling: dict | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin of position * theta**(-2i / head_dim) (`scaling`: Llama 3.1's, see `_llama3_scaled`), fp32,
    [max_seq_len, head_dim // 2]; on the CPU whatever the default device (the meta device's arithmetic would
    import torch._dynamo)."""
    freqs = 1.0 / (theta ** (torch.arange(0, head_dim, 2, device="cpu")[: head_dim // 2].float() / head_dim))
    if scaling is not None:
        freqs = _llama3_scaled(freqs, scaling)
    angles = torch.outer(torch.arange(max_seq_len, device="cpu").float(), freqs)
    return angles.cos(), angles.sin()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate interleaved pairs (x[2i], x[2i+1]) of x [B, T, H, D] in fp32 (fp64 x: fp64); returns x's dtype."""
    x0, x1 = x.to(torch.promote_types(x.dtype, torch.float32)).unflatten(-1, (-1, 2)).unbind(-1)
    cos, sin = cos[:, None, :], sin[:, None, :]
    return torch.stack((x0 * cos - x1 * sin, x0 * sin + x1 * cos), dim=-1).flatten(-2).type_as(x)


class Attention(nn.Module):
    def __init__(self, args: ModelArgs):
        super().__init__()
        self.n_heads, self.n_kv_heads, self.head_dim = args.n_heads, args.n_kv_heads, args.head_dim
        self.wq = Linear(args.dim, args.n_heads * self.head_dim, bias=args.qkv_bias)
        self.wk = Linear(args.dim, args.n_kv_heads * self.head_dim, bias=args.qkv_bias)
        self.wv = Linear(args.dim, args.n_kv_heads * self.head_dim, bias=args.qkv_bias)
        self.wo = Linear(args.n_heads * self.head_dim, args.dim)
        if args.qk_norm:
            self.q_norm = RMSNorm(self.head_dim, args.norm_eps)
            self.k_norm = RMSNorm(self.head_dim, args.norm_eps)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        B, T, _ = x.shape
        q = self.wq(x).view(B, T, self.n_heads, self.head_dim)
        k = self.wk(x).view(B, T, self.n_kv_heads, self.head_dim)
        if hasattr(self, "q_norm"):  # per head, in the compute dtype, before RoPE (Qwen3)
            q, k = self.q_norm(q, x.dtype), self.k_norm(k, x.dtype)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        v = self.wv(x).view(B, T, self.n_kv_heads, self.head_dim)
        rep = self.n_heads // self.n_kv_heads  # grouped-query attention: share each kv head
        k = k.unsqueeze(3).expand(B, T, self.n_kv_heads, rep, self.head_dim).reshape(B, T, self.n_heads, self.head_dim)
        v = v.unsqueeze(3).expand(B, T, self.n_kv_heads, rep, self.head_dim).reshape(B, T, self.n_heads, self.head_dim)
        out = compute.attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True)
        return self.wo(out.transpose(1, 2).reshape(B, T, -1))

    def init_weights(self, out_std: float, generator):
        for linear in (self.wq, self.wk, self.wv):
            nn.init.trunc_normal_(linear.weight, std=0.02, generator=generator)
            if linear.bias is not None:
                nn.init.zeros_(linear.bias)
        nn.init.trunc_normal_(self.wo.weight, std=out_std, generator=generator)
        if hasattr(self, "q_norm"):
            self.q_norm.reset_parameters()
            self.k_norm.reset_parameters()


class FeedForward(nn.Module):
    def __init__(self, args: ModelArgs):
        super().__init__()
        self.w1 = Linear(args.dim, args.ffn_hidden_dim)
        self.w2 = Linear(args.ffn_hidden_dim, args.dim)
        self.w3 = Linear(args.dim, args.ffn_hidden_dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(F.silu(self.w1(x)) * self.w3(x))

    def init_weights(self, out_std: float, generator):
        nn.init.trunc_normal_(self.w1.weight, std=0.02, generator=generator)
        for linear in (self.w2, self.w3):
            nn.init.trunc_normal_(linear.weight, std=out_std, generator=generator)


def _keep_outputs(ctx, op, *args, **kwargs):
    return torch.utils.checkpoint.CheckpointPolicy.MUST_SAVE


def _kept_for_backward(fn, *args):
    """`fn(*args)` with its output saved for the backward pass rather than recomputed there, in a
    compiled region (a selective-checkpoint region whose ops are all MUST_SAVE: the partitioner
    keeps what the backward needs of them and recomputes none)."""
    context = functools.partial(torch.utils.checkpoint.create_selective_checkpoint_contexts, _keep_outputs)
    return torch.utils.checkpoint.checkpoint(fn, *args, use_reentrant=False, context_fn=context)


class TransformerBlock(nn.Module):
    """h -> h + attention(norm(h)) -> + feed_forward(norm(.)), both adds rounded to `fmt`.

    `activation_checkpoint` (set by `streamback.train.parallel.apply_activation_checkpointing`)
    recomputes the block on the backward pass (torch.utils.checkpoint, non-reentrant).
    With `parts=True` the block also returns what the reversible stream needs: the residual
    between its two sublayers and the two deltas; `parts="detached"` returns them detached, so
    that a compiled block has no gradient to take for them (torch.compile would materialise
    zeros for each and add them into its backward).

    Under torch.compile the residual between the sublayers is kept for the backward pass, as
    eagerly (it is the second norm's input, which `_RMSNormFunction` saves; the partitioner may
    keep it normalised, the same bytes). Left alone, the
    partitioner keeps the first delta instead and recomputes the residual from the block's
    input in two backward kernels; Inductor (2.11-2.13) then fuses the two norms' weight-gradient
    sums together, which splits the norms' backward into a looped reduction and an over-fused
    one (measured on an H200: docs/measurements.md; the baseline's bf16 rounding chain is kept
    anyway). Keeping it costs an fp32 stream 2 more bytes an element per
    layer (a bf16 one none) and gives the baseline's kernels (see `_kept_for_backward`).
    """

    def __init__(self, layer_id: int, args: ModelArgs, fmt: StreamFormat, compute_dtype: torch.dtype):
        super().__init__()
        self.fmt, self.compute_dtype = fmt, compute_dtype
        self.attention_norm = RMSNorm(args.dim, args.norm_eps)
        self.attention = Attention(args)
        self.ffn_norm = RMSNorm(args.dim, args.norm_eps)
        self.feed_forward = FeedForward(args)
        self.init_std = 0.02 / (2 * (layer_id + 1)) ** 0.5  # TorchTitan's depth_init
        self.activation_checkpoint = False

    def forward(self, h: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, parts: bool = False):
        if self.activation_checkpoint:
            return torch.utils.checkpoint.checkpoint(self._forward, h, cos, sin, parts, use_reentrant=False)
        return self._forward(h, cos, sin, parts)

    def _forward(self, h, cos, sin, parts):
        delta0 = self.attention(self.attention_norm(h, self.compute_dtype), cos, sin)
        if torch.compiler.is_compiling() and not self.activation_checkpoint:
            mid = _kept_for_backward(self.fmt.add, h, delta0)
        else:
            mid = self.fmt.add(h, delta0)
        delta1 = self.feed_forward(self.ffn_norm(mid, self.compute_dtype))
        out = self.fmt.add(mid, delta1)
        if parts == "detached":
            return out, mid.detach(), delta0.detach(), delta1.detach()
        return (out, mid, delta0, delta1) if parts else out

    def init_weights(self, generator):
        self.attention_norm.reset_parameters()
        self.ffn_norm.reset_parameters()
        self.attention.init_weights(self.init_std, generator)
        self.feed_forward.init_weights(self.init_std, generator)


class Transformer(nn.Module):
    """Llama 3 decoder: tokens [B, T] -> fp32 logits [B, T, vocab_size] (fp64 for fp64 compute).

    `stream_format` is the stream's format (the compute dtype's for the baseline).
    `capture(...)` is the one way to read the residual stream of a forward pass (see
    `StreamCapture`). After a forward with the reversible stream (and grad enabled),
    `reversible_stats` holds its byte counts; `rebuild_block` is the function it rebuilds a
    block's residuals with (`step_back_block`; `apply_compile` puts in its compiled version, as
    it does for `head_loss`).
    """

    def __init__(self, args: ModelArgs, compute_dtype: torch.dtype = torch.bfloat16):
        super().__init__()
        if compute_dtype not in _DTYPE_FORMAT:
            raise StreambackError(f"compute dtype must be one of {list(_DTYPE_FORMAT)}, got {compute_dtype}")
        self.args, self.compute_dtype = args, compute_dtype
        self.stream_format = args.stream_format(compute_dtype)
        # its values come from init_weights (nn.Embedding's own init, normal_, would import torch._dynamo on
        # the meta device: a second per process that only builds a model there to read one in)
        self.tok_embeddings = nn.Embedding(args.vocab_size, args.dim, _weight=torch.empty(args.vocab_size, args.dim))
        self.layers = nn.ModuleList(
            TransformerBlock(i, args, self.stream_format, compute_dtype) for i in range(args.n_layers)
        )
        self.norm = RMSNorm(args.dim, args.norm_eps)
        self.output = Linear(args.dim, args.vocab_size)
        if args.tied_embeddings:
            self.output.weight = self.tok_embeddings.weight
        cos, sin = rope_tables(args.head_dim, args.max_seq_len, args.rope_theta, args.rope_scaling)
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)
        self._capture: StreamCapture | None = None
        self.reversible_stats: dict[str, int] | None = None
        self.rebuild_block = step_back_block
        self.init_weights()

    def to_empty(self, *, device: torch.device | str | None, recurse: bool = True) -> Transformer:
        """nn.Module's `to_empty`: every parameter and buffer moved to `device` as uninitialised
        storage of its shape and dtype. Unlike torch's, it keeps tied embeddings tied (torch's gives
        the output projection storage of its own, so a tied model built on the meta device would
        train two matrices) and makes the storage with `torch.empty`: torch's `empty_like` has a
        Python kernel on the meta device that imports sympy on its first call, a cost to every
        process that builds a model there to read one in (docs/measurements.md)."""
        self._apply(lambda t: torch.empty(t.shape, dtype=t.dtype, device=device), recurse=recurse)
        if self.args.tied_embeddings:
            self.output.weight = self.tok_embeddings.weight
        return self

    def init_weights(self, seed: int | None = None):
        """TorchTitan's init (see the module docstring); `seed` makes it independent of global RNG.

        Also recomputes the RoPE tables, so a model built on the meta device and moved with
        `to_empty` is complete after this call. Call it before `apply_fsdp`.
        """
        device = self.tok_embeddings.weight.device
        self.init_buffers()
        if device.type == "meta":  # no values to set (the same reason as the embedding's in __init__)
            return
        generator = None if seed is None else torch.Generator(device=device).manual_seed(seed)
        with torch.no_grad():
            nn.init.normal_(self.tok_embeddings.weight, std=self.args.embedding_init_std, generator=generator)
            for layer in self.layers:
                layer.init_weights(generator)
            self.norm.reset_parameters()
            std = self.args.dim**-0.5
            nn.init.trunc_normal_(self.output.weight, std=std, a=-3 * std, b=3 * std, generator=generator)

    def init_buffers(self) -> None:
        """Compute the RoPE tables (not saved in the state dict) on the parameters' device."""
        device = self.tok_embeddings.weight.device
        cos, sin = rope_tables(self.args.head_dim, self.args.max_seq_len, self.args.rope_theta, self.args.rope_scaling)
        self.rope_cos, self.rope_sin = cos.to(device), sin.to(device)

    def embed(self, tokens: torch.Tensor) -> torch.Tensor:
        """h_0, the stream's first residual: the token embedding in the compute dtype, entered
        into the stream's format. The reversible stream recomputes it on the backward pass."""
        weight = self.tok_embeddings.weight
        if torch.is_grad_enabled():  # cast the table, as FSDP2's bf16 parameters are: same gradient
            rows = F.embedding(tokens, weight.to(self.compute_dtype))
        else:  # the same values, casting only the rows looked up (no copy of the whole table)
            rows = F.embedding(tokens, weight).to(self.compute_dtype)
        return self.stream_format.enter(rows)

    def forward(self, tokens: torch.Tensor, targets: torch.Tensor | None = None) -> torch.Tensor:
        """Logits [B, T, vocab_size] of `tokens` [B, T]; with `targets` [B, T], their mean
        next-token cross-entropy instead (`head_loss`: the training step's loss)."""
        T = tokens.shape[1]
        if T > self.args.max_seq_len:
            raise StreambackError(f"sequence length {T} exceeds the model's max_seq_len {self.args.max_seq_len}")
        cos, sin = self.rope_cos[:T], self.rope_sin[:T]
        reversible = self.args.reversible and torch.is_grad_enabled()
        stream = (
            ReversibleStream(bottom=lambda: self.embed(tokens), rebuild_block=self.rebuild_block)
            if reversible
            else None
        )
        capture = self._capture
        # a capture without gradients takes the parts detached: a compiled block then has no gradient to take for them
        parts = (True if capture.grad else "detached") if capture is not None and capture.wants_parts else False
        with stream if stream is not None else contextlib.nullcontext():
            h = self.embed(tokens)
            if capture is not None:
                capture._begin(h)
            for layer in self.layers:
                if stream is not None:
                    out = stream.step(layer, h, cos, sin, live=capture is not None and capture.grad)
                else:
                    out = layer(h, cos, sin, parts=parts)
                if capture is not None:
                    capture._layer(*(out if isinstance(out, tuple) else (out,)))
                h = out[0] if isinstance(out, tuple) else out
            result = self.logits(h) if targets is None else self.head_loss(h, targets)
        if stream is not None:
            self.reversible_stats = stream.stats
        return result

    def logits(self, h: torch.Tensor) -> torch.Tensor:
        """The output head on the last residual: final norm, output projection, fp32 logits (fp64 for fp64 compute)."""
        return self.output(self.norm(h, self.compute_dtype)).to(torch.promote_types(self.compute_dtype, torch.float32))

    def head_loss(self, h: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """Mean next-token cross-entropy (nats) of the logits of `h`: `streamback.train.validation.
        next_token_loss` of `logits(h)`, the same operations. One function so that `apply_compile`
        can compile it whole: Inductor then fuses the fp32 conversion, the log-softmax and its
        gradient into the kernels that read the bf16 logits, and the fp32 logits (4 GiB for
        4 x 2048 tokens of a 128K vocabulary), their log-softmax and its gradient are never
        written out (eagerly they are: about 36 bytes moved per logit)."""
        return F.cross_entropy(self.logits(h).flatten(0, 1), targets.flatten())

    @contextlib.contextmanager
    def capture(self, points: tuple[str, ...] = STREAM_POINTS, fn=None, grad: bool = False, add_fn=None):
        """Capture the residual stream of every forward pass run inside the block.

        Yields a `StreamCapture`, refilled by each forward (so it holds the latest one's):
        `capture["residual"]` is h_0 .. h_L (after the embedding and after each block),
        `capture["mid"]` the residual between each block's two sublayers, `capture["attention"]`
        and `capture["feed_forward"]` each sublayer's output (its delta, in the compute dtype).
        `points` chooses which are kept (asking for only "residual" leaves the blocks' code
        unchanged, e.g. under torch.compile). Each kept tensor is `fn(tensor)` if `fn` is given
        (e.g. a statistic, so nothing full-size is held), else the tensor. Tensors are detached,
        unless `grad`: then they are the live tensors with their gradients retained, read
        `.grad` after the backward pass (the reversible stream then still holds them).
        `add_fn(h, delta, h')`, if given, is also applied to every add into the stream as it
        happens (`capture["adds"]`, e.g. `streamback.model.swallow.swallow_counts`).
        """
        if self._capture is not None:
            raise RuntimeError("Transformer.capture: a capture is already active on this model")
        self._capture = StreamCapture(points, fn, grad, add_fn)
        try:
            yield self._capture
        finally:
            self._capture = None

    @contextlib.contextmanager
    def stream_as(self, fmt: StreamFormat):
        """Run the forward passes inside the block with the stream in `fmt` (the same weights and
        compute dtype): the trainer's full-precision shadow (`streamback.train.signals`)."""
        kept = self.stream_format
        self.stream_format = fmt
        for layer in self.layers:
            layer.fmt = fmt
        try:
            yield
        finally:
            self.stream_format = kept
            for layer in self.layers:
                layer.fmt = kept


def norm_gain_absmax(model: nn.Module) -> dict[str, float]:
    """max |gain| of every RMSNorm, by module name (a collective under FSDP2: call on all ranks)."""
    out = {}
    for name, module in model.named_modules():
        if isinstance(module, RMSNorm):
            weight = module.weight.detach()
            if hasattr(weight, "full_tensor"):  # an FSDP2-sharded DTensor
                weight = weight.full_tensor()
            out[name] = float(weight.abs().max())
    return out


def count_params(model: nn.Module, exclude_embeddings: bool = False) -> int:
    """Number of parameters (a tied matrix counted once); optionally without the token embedding.

    The output projection is always counted: it is a matmul on every token (as in TorchTitan's
    FLOP count, which leaves out only the embedding lookup).
    """
    embedding = model.tok_embeddings.weight
    return sum(p.numel() for p in model.parameters() if not (exclude_embeddings and p is embedding))


def model_args_from_dict(data: dict) -> ModelArgs:
    """ModelArgs from `dataclasses.asdict(args)` (as saved in checkpoints); names bad keys."""
    fields = dataclasses.fields(ModelArgs)
    unknown = sorted(set(data) - {f.name for f in fields})
    missing = sorted({f.name for f in fields if f.default is dataclasses.MISSING} - set(data))
    if unknown or missing:
        raise StreambackError(f"model_args: unknown keys {unknown}, missing keys {missing}")
    return ModelArgs(**data)
