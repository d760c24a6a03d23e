"""Residual-stream formats: how the stream is stored between layers and how each addition is rounded.

A `StreamFormat` names a number format (`STREAM_FORMATS`) and a rounding (`nearest` or `stochastic`).
The model calls `fmt.enter(x)` once after the embedding and `fmt.add(h, delta)` at every
residual addition; both return a tensor of `fmt.container_dtype` whose values lie on the
format's grid.

- `fp32`, `bf16`, `fp16`: native dtypes. Nearest rounding is torch's own add in that dtype
  (under torch.compile, the same rounding done on the bit pattern; see `_native_nearest_eager`).
- `fp64` (`REFERENCE_FORMATS`, not a stream the study trains with): the analyses' ground truth,
  with an fp64 compute dtype (`streamback.analysis`); eager, nearest only.
- `fp8_e4m3`, `fp8_e5m2`: torch has float8 dtypes but no arithmetic on them, so the stream is
  held in bf16 (every E4M3 value, 4 significant bits with exponents -9..8, and every E5M2 value,
  3 significant bits with exponents -16..15, is exactly a bf16: 8 significant bits, exponents
  down to -133) and each fp32 sum is rounded onto the fp8 grid. No scaling: out-of-range sums
  saturate to +-448 / +-57344 (OCP "satfinite" conversion) and tiny ones flush to zero.
- `mxfp8`: OCP Microscaling Formats (MX) Specification v1.0, MXFP8 (E4M3 elements, k = 32), see
  `quantize_mx`. Held in fp32: the E8M0 scale (2^-127..2^127) times E4M3 elements spans values
  down to 2^-136, below bf16's smallest subnormal (2^-133) but exact in fp32 (2^-149).
- `nvfp4`: NVIDIA NVFP4 (E2M1 elements, k = 16, E4M3 block scale, fp32 tensor scale), see
  `quantize_nvfp4`: the recipe's element codes and block scales, bit for bit. Held in fp32: the
  product of an E2M1 element, an E4M3 block scale and the tensor decode scale has 2 + 4 + 18
  significant bits (the decode scale is kept to 18 bits for this). The tensor scale is per
  stream tensor, so it is shared by every token of the micro-batch.

Stochastic rounding (any format but fp32) adds in fp32 and rounds the sum with
`streamback.model.rounding.round_to(..., "stochastic")`, the package's one SR implementation; for the
block formats it rounds the elements, while the scales are always chosen deterministically (as
in the MX spec and NVIDIA's recipe, where SR applies to element conversion only). `fp32` has no
stochastic variant: its sum is already an fp32 rounding, and fp32 is the reference stream.

Every quantisation passes the gradient straight through (`_StraightThrough`), so the backward
pass sees the identity. The hot path (`enter`, `add`, `quantize_mx`, `quantize_nvfp4`) has no
data-dependent Python control flow, so it traces under `torch.compile`. The block formats group
the LAST (hidden) dimension; a hidden size that is not a multiple of the block (1512 = 47 x 32
+ 8) ends in one shorter block, which quantises exactly as if it were zero-padded to the block
size (zeros do not change a block's amax), as the MX reference code does.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from streamback.errors import StreambackError
from streamback.model.rounding import BF16, FP4_E2M1, FP8_E4M3, FP8_E5M2, FP16, FP32, ROUNDINGS, FloatSpec, round_to

STREAM_FORMATS = ("fp32", "bf16", "fp16", "fp8_e4m3", "fp8_e5m2", "mxfp8", "nvfp4")
REFERENCE_FORMATS = ("fp64",)  # the analyses' ground truth, never trained with

# formats whose container dtype is the format itself (nearest add = torch's add)
_NATIVE = ("fp32", "bf16", "fp16", "fp64")
_ELEMENT = {"fp32": FP32, "bf16": BF16, "fp16": FP16, "fp8_e4m3": FP8_E4M3, "fp8_e5m2": FP8_E5M2}
_CONTAINER = {
    "fp32": torch.float32,
    "fp64": torch.float64,
    "bf16": torch.bfloat16,
    "fp16": torch.float16,
    "fp8_e4m3": torch.bfloat16,
    "fp8_e5m2": torch.bfloat16,
    "mxfp8": torch.float32,
    "nvfp4": torch.float32,
}

MX_BLOCK = 32
MX_ELEMENT_EMAX = 8  # exponent of E4M3's largest normal (448 = 1.75 * 2^8)
E8M0_MIN_EXPONENT = -127  # E8M0 encodes 2^-127 .. 2^127 and NaN

NVFP4_BLOCK = 16
NVFP4_ELEMENT_MAX = 6.0  # E2M1
NVFP4_SCALE_MAX = 448.0  # E4M3
# The tensor decode scale the stream's values carry is rounded to 18 significant bits (17 stored),
# so element x block scale x decode scale (2 + 4 + 18 bits) is exact in the fp32 container: the
# stream holds NVFP4 values exactly and quantising them again gives them back. The codes are the
# recipe's; only this one per-tensor factor differs from it, by < 2^-18 relative.
_TENSOR_SCALE = FloatSpec("nvfp4_tensor_scale", 17, -126, FP32.max_value, False)
_E2M1_POSITIVE = (0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)


def _blocks(x: torch.Tensor, size: int) -> list[torch.Tensor]:
    """Split [..., D] into [..., D // size, size] full blocks and, if D % size, one [..., 1, D % size] short block.

    The short block is sliced off rather than zero-padded: Inductor (torch 2.13, CPU) miscompiles
    pad -> per-block amax -> divide -> slice when the result feeds another op (garbage in the
    padded block's columns), while slicing compiles correctly.
    """
    width = x.shape[-1]
    full = width - width % size
    parts = [x[..., :full].unflatten(-1, (-1, size))] if full else []
    if full < width:
        parts.append(x[..., full:].unsqueeze(-2))
    return parts


def _unblock(parts: list[torch.Tensor]) -> torch.Tensor:
    flat = [p.flatten(-2) for p in parts]
    return flat[0] if len(flat) == 1 else torch.cat(flat, dim=-1)


def _power_of_two(exponent: torch.Tensor) -> torch.Tensor:
    """2.0**exponent (int32, -127..127) built from its fp32 bit pattern, so it is exact."""
    normal = (exponent + 127).clamp(min=1) << 23
    return torch.where(exponent >= -126, normal, 1 << 22).view(torch.float32)  # 2^-127: subnormal


def quantize_mx(x: torch.Tensor, rounding: str = "nearest", generator: torch.Generator | None = None) -> torch.Tensor:
    """MXFP8 (OCP MX v1.0, E4M3 elements, k = 32 along the last dim); dequantised fp32 values.

    Per block: shared exponent = floor(log2(amax)) - emax_elem with emax_elem = 8, read exactly
    from amax's fp32 exponent field (fp32 log2 rounds up just below a power of two), clamped
    below at E8M0's -127 (as the MX reference code does: tiny blocks keep scale 2^-127 and their
    elements flush on E4M3's subnormal grid). Elements = round_to(x / X, E4M3), saturating to
    +-448 (amax / X lies in [256, 512), so the top of a block can clip to 448 X). A block whose
    amax is NaN or Inf gets the NaN scale, so all its elements are NaN; an all-zero block is
    zeros. `rounding` applies to the elements; the scale is always deterministic.
    """
    return _unblock([_mx_blocks(b, rounding, generator) for b in _blocks(x.float(), MX_BLOCK)])


def _mx_blocks(blocks: torch.Tensor, rounding: str, generator: torch.Generator | None) -> torch.Tensor:
    amax = blocks.abs().amax(dim=-1, keepdim=True)
    exponent = ((amax.view(torch.int32) >> 23) & 0xFF) - 127  # zero/subnormal amax -> -127
    shared = (exponent - MX_ELEMENT_EMAX).clamp(min=E8M0_MIN_EXPONENT)  # finite amax: <= 119
    elements = round_to(blocks * _power_of_two(-shared), FP8_E4M3, rounding, generator)
    out = elements * _power_of_two(shared)
    return torch.where(torch.isfinite(amax), out, torch.nan)


def quantize_nvfp4(
    x: torch.Tensor, rounding: str = "nearest", generator: torch.Generator | None = None
) -> torch.Tensor:
    """NVFP4 (E2M1 elements, k = 16 along the last dim); dequantised fp32 values.

    NVIDIA's recipe (NVIDIA, "Pretraining Large Language Models with NVFP4", arXiv:2509.25149),
    with the fp32 arithmetic of Transformer Engine's NVFP4 reference quantiser, so that element
    codes and block scales equal the recipe's bit for bit: tensor encode scale S = 2688 /
    amax_tensor (2688 = 448 * 6; at most fp32's max) and decode scale D = 1 / S; block scale
    b = round_E4M3(amax_block / 6 * S), saturating at 448; elements q = round_E2M1(x * (1 / (b * D)))
    saturating at +-6. The value held is q * b * s with s = amax_tensor / 2688 (the decode scale
    the recipe's GEMM applies) rounded to 18 significant bits, so that it is exact in fp32 (see
    `_TENSOR_SCALE`); below fp32's normal range s is kept as it is (the container cannot hold such
    values exactly anyway). Rounding of the block scale to nearest can put the top of a block just
    above 6, so it clips to 6, as in the recipe. A block whose scale underflows E4M3 (amax_block
    below about amax_tensor * 2^-10 / 448) is zeros. NaN/Inf elements are left out of the tensor
    amax and make their own block all NaN (the MX rule). An all-zero tensor is zeros. `rounding`
    applies to the elements; both scales are always rounded to nearest.
    """
    x = x.float()
    tensor_amax = torch.where(torch.isfinite(x), x.abs(), 0.0).amax()
    encode = (NVFP4_SCALE_MAX * NVFP4_ELEMENT_MAX / tensor_amax).clamp(max=FP32.max_value)  # S
    value_scale = tensor_amax / (NVFP4_SCALE_MAX * NVFP4_ELEMENT_MAX)
    value_scale = torch.where(value_scale >= 2.0**-126, round_to(value_scale, _TENSOR_SCALE), value_scale)
    scales = (encode, 1.0 / encode, value_scale)
    return _unblock([_nvfp4_blocks(b, *scales, rounding, generator) for b in _blocks(x, NVFP4_BLOCK)])


def _nvfp4_blocks(
    blocks: torch.Tensor, encode, decode, value_scale, rounding: str, generator: torch.Generator | None
) -> torch.Tensor:
    finite = torch.isfinite(blocks)
    block_amax = torch.where(finite, blocks.abs(), 0.0).amax(dim=-1, keepdim=True)
    block_scale = round_to(block_amax / NVFP4_ELEMENT_MAX * encode, FP8_E4M3)  # overflow (inf) -> 448
    element_encode = (1.0 / (block_scale * decode)).clamp(max=FP32.max_value)  # a zero scale: fp32's max
    elements = round_to(blocks * element_encode, FP4_E2M1, rounding, generator)
    out = elements * (block_scale * value_scale)  # exact: 2 + 4 + 18 bits
    return torch.where(finite.all(dim=-1, keepdim=True), out, torch.nan)


def _on_nvfp4_grid(x: torch.Tensor) -> bool:
    """Per block of 16: are all values one E2M1 vector times a common scale (or all NaN)?

    The scale is unknown, but it cancels in ratios: some E2M1 value q_max makes x * q_max / amax
    an E2M1 vector. Checked in float64, where those products and quotients are exact.
    """
    return all(bool(_e2m1_times_scale(b.double()).all()) for b in _blocks(x.float(), NVFP4_BLOCK))


def _e2m1_times_scale(blocks: torch.Tensor) -> torch.Tensor:
    amax = blocks.abs().amax(dim=-1, keepdim=True)
    ok = (amax == 0).squeeze(-1) | torch.isnan(blocks).all(dim=-1)
    for q_max in _E2M1_POSITIVE:
        ratio = blocks * q_max / amax
        ok |= (round_to(ratio.float(), FP4_E2M1).double() == ratio).all(dim=-1)
    return ok


def _quantise(name: str, x: torch.Tensor, rounding: str) -> torch.Tensor:
    if name == "mxfp8":
        return quantize_mx(x, rounding)
    if name == "nvfp4":
        return quantize_nvfp4(x, rounding)
    return round_to(x, _ELEMENT[name], rounding)


class _StraightThrough(torch.autograd.Function):
    """Quantise an fp32 tensor onto a format's grid; the gradient passes through unchanged."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, name: str, rounding: str) -> torch.Tensor:
        out = _quantise(name, x, rounding)
        if out._base is None:
            return out
        # MX and NVFP4 quantise in blocks and return the flat view of them. A view as a block's
        # output would lose FSDP2's pre-backward hook (its gradient reduction) to any in-place op
        # on it: return a tensor of its own. Eagerly a detached alias is one, at no cost; a compiled
        # graph would hand the view back, so there it is a copy (the fused kernel's own output).
        return out.clone() if torch.compiler.is_compiling() else out.detach()

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        return grad, None, None


@dataclass(frozen=True)
class StreamFormat:
    """A residual-stream format: number format `name` (one of STREAM_FORMATS) and its rounding."""

    name: str = "fp32"
    rounding: str = "nearest"

    def __post_init__(self):
        if self.name not in STREAM_FORMATS + REFERENCE_FORMATS:
            raise StreambackError(
                f"unknown residual-stream format {self.name!r}: expected one of {', '.join(STREAM_FORMATS)}"
            )
        if self.rounding not in ROUNDINGS:
            raise StreambackError(
                f"unknown rounding {self.rounding!r} for stream format {self.name!r}: "
                f"expected one of {', '.join(ROUNDINGS)}"
            )
        if self.name in ("fp32", "fp64") and self.rounding == "stochastic":
            raise StreambackError(
                f"stream format {self.name!r} has no stochastic rounding: its sum is already rounded "
                f"to {self.name} (use {self.name!r}, or stochastic rounding of a narrower format)"
            )

    @classmethod
    def parse(cls, text: str) -> StreamFormat:
        """'bf16', 'bf16_sr', 'bf16:stochastic', 'mxfp8:nearest', ... (also accepts `label`s)."""
        spec = str(text).strip().lower()
        name, sep, rounding = spec.partition(":")
        if not sep:
            rounding = "nearest"
            if name.endswith("_sr"):
                name, rounding = name[: -len("_sr")], "stochastic"
        if name not in STREAM_FORMATS + REFERENCE_FORMATS or rounding not in ROUNDINGS:
            raise StreambackError(
                f"bad residual-stream format {text!r}: expected one of {', '.join(STREAM_FORMATS)}, "
                f"optionally with '_sr' or ':stochastic' / ':nearest' (e.g. 'bf16_sr', 'mxfp8:stochastic')"
            )
        return cls(name, rounding)

    @property
    def container_dtype(self) -> torch.dtype:
        """dtype of the stream tensor between layers."""
        return _CONTAINER[self.name]

    @property
    def label(self) -> str:
        """Short run-name suffix: 'bf16', 'bf16_sr', 'mxfp8_sr', ..."""
        return self.name + ("_sr" if self.rounding == "stochastic" else "")

    def enter(self, x: torch.Tensor) -> torch.Tensor:
        """Bring a tensor (the embedding output) into the stream."""
        if self.name == "fp32":
            return x.float()
        if self.name == "fp64":
            return x.double()
        if self._native_nearest_eager():
            return x.to(self.container_dtype)
        return _StraightThrough.apply(x.float(), self.name, self.rounding).to(self.container_dtype)

    def add(self, h: torch.Tensor, delta: torch.Tensor) -> torch.Tensor:
        """h + delta, the sum rounded to the format; the result has `container_dtype`."""
        dtype = self.container_dtype
        if self.name == "fp64":
            return h.double() + delta
        # Mixed dtypes are added in one kernel: torch converts each input exactly to the promoted
        # dtype (fp32 for a bf16 delta and an fp32 or fp16 stream) as it reads it and rounds the
        # sum once, so no fp32 copy of the delta is written and read back (the same bits).
        if self._native_nearest_eager():
            total = h + delta
            return total if total.dtype == dtype else total.to(dtype)
        total = h.float() + delta
        if self.name == "fp32":
            return total
        return _StraightThrough.apply(total, self.name, self.rounding).to(dtype)

    def _native_nearest_eager(self) -> bool:
        """Use torch's own bf16/fp16 arithmetic? Only eagerly: Inductor (with its default
        `emulate_precision_casts=False`) keeps a fused chain of bf16 adds in fp32 registers and
        skips the rounding of the intermediate sums, `.to(bf16)` included, so a compiled bf16
        stream would silently carry fp32 precision inside each fused kernel. Under compile the
        sum is rounded by `round_to` on its bit pattern instead, which no fusion can elide and
        which gives the same bits as the eager add (RNE of the fp32 sum)."""
        return self.name in _NATIVE and self.rounding == "nearest" and not torch.compiler.is_compiling()

    def spacing(self, magnitude: torch.Tensor) -> torch.Tensor:
        """The grid's step at `magnitude` (fp64, the same shape): an update smaller than half of it
        is rounded away there (nearest rounding). For the element formats the gap between adjacent
        values in the binade of |magnitude| (subnormal spacing below the normal range; what
        `torch.nextafter` gives upwards on that grid). For the block formats at a block whose
        largest magnitude it is: MXFP8 puts that value in E4M3's top binade of the block's scale,
        a step of 2^(floor(log2 |m|) - 3); NVFP4 holds it as element 6 times the block's scale,
        whose next value down is 4, a step of |m| / 3."""
        m = magnitude.double().abs()
        if self.name == "nvfp4":
            return m / 3
        if self.name == "mxfp8":
            mantissa_bits, min_exponent = FP8_E4M3.mantissa_bits, E8M0_MIN_EXPONENT + MX_ELEMENT_EMAX
        elif self.name == "fp64":
            mantissa_bits, min_exponent = 52, -1022
        else:
            mantissa_bits, min_exponent = _ELEMENT[self.name].mantissa_bits, _ELEMENT[self.name].min_exponent
        exponent = torch.where(m > 0, torch.frexp(m).exponent - 1, min_exponent).clamp(
            min=min_exponent
        )  # floor(log2 m)
        return torch.ldexp(torch.ones_like(m), exponent - mantissa_bits)

    def is_representable(self, h: torch.Tensor) -> bool:
        """dtype is `container_dtype` and every value lies on the format's grid (NaN counts).

        For tests and asserts only (it synchronises). For nvfp4 the check is per block: every
        block of 16 is an E2M1 vector times one common scale.
        """
        if h.dtype != self.container_dtype:
            return False
        if self.name in _NATIVE:
            return True
        x = h.float()
        if self.name == "nvfp4":
            return _on_nvfp4_grid(x)
        return bool(((_quantise(self.name, x, "nearest") == x) | torch.isnan(x)).all())


# every stream the model can keep, by label: each format with each rounding it has (fp32 has no stochastic variant)
STREAM_LABELS = tuple(
    StreamFormat(n, r).label for n in STREAM_FORMATS for r in ROUNDINGS if (n, r) != ("fp32", "stochastic")
)
