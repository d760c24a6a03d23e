"""Rounding fp32 values onto narrower floating-point grids: nearest-even and stochastic.

This is the package's single implementation of rounding to a format. Every place that
needs a narrow float (the drift simulations, the residual-stream formats, the MX/NVFP4
element types) calls `round_to` with a `FloatSpec`.

Both roundings work on the fp32 bit pattern. A format with `m` stored mantissa bits keeps
the top `m` of fp32's 23; the `23 - m` bits below the cut are either rounded half-to-even
(`nearest`) or have uniform random bits added before they are truncated (`stochastic`,
which rounds up with probability equal to the distance from the lower grid point, so the
result is unbiased). Values below the format's smallest normal lie on the format's
subnormal grid, a fixed spacing of 2**(min_exponent - m); they are rounded in float64
arithmetic, where every step is exact. The result is always an fp32 tensor holding values
of the target format (so it can be stored in the native dtype without further rounding).

`round_to` draws its own random numbers (`stochastic_noise`: the bits are cut from 64-bit draws,
16 or 32 bits a field, so a bf16 rounding costs half a 32-bit draw). `round_fp32` is the same
arithmetic with the random numbers passed in, for a caller that draws many roundings' worth at
once or compiles the rounding (torch.compile does not take a generator).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

ROUNDINGS = ("nearest", "stochastic")


@dataclass(frozen=True)
class FloatSpec:
    """A binary floating-point format: stored mantissa bits, smallest normal exponent, range."""

    name: str
    mantissa_bits: int
    min_exponent: int  # exponent of the smallest normal number
    max_value: float  # largest finite magnitude
    saturate: bool  # out-of-range values clamp to +-max_value (else they become inf)
    dtype: torch.dtype | None = None  # native torch dtype, if one exists
    infinities: bool = True  # has +-inf encodings; without them +-inf rounds to +-max_value

    @property
    def smallest_subnormal(self) -> float:
        return math.ldexp(1.0, self.min_exponent - self.mantissa_bits)


# fp32's own grid is the identity for fp32 inputs.
FP32 = FloatSpec("fp32", 23, -126, float(torch.finfo(torch.float32).max), False, torch.float32)
BF16 = FloatSpec("bf16", 7, -126, float(torch.finfo(torch.bfloat16).max), False, torch.bfloat16)
FP16 = FloatSpec("fp16", 10, -14, 65504.0, False, torch.float16)
# OCP 8-bit formats, converted with saturation (OCP "satfinite", PTX cvt.satfinite): finite values
# beyond the range clamp to +-max. E4M3 has no infinities, so +-inf becomes +-448 too (torch's
# float8_e4m3fn cast does the same); E5M2 keeps +-inf (torch's cast agrees) while its finite
# overflow saturates (torch's cast gives inf there). NaN stays NaN in both.
FP8_E4M3 = FloatSpec("fp8_e4m3", 3, -6, 448.0, True, torch.float8_e4m3fn, infinities=False)
FP8_E5M2 = FloatSpec("fp8_e5m2", 2, -14, 57344.0, True, torch.float8_e5m2)
# OCP MX FP4 element: E2M1, values {0, 0.5, 1, 1.5, 2, 3, 4, 6}, no inf/NaN encodings (+-inf -> +-6).
FP4_E2M1 = FloatSpec("fp4_e2m1", 1, 0, 6.0, True, None, infinities=False)

SPECS = {s.name: s for s in (FP32, BF16, FP16, FP8_E4M3, FP8_E5M2, FP4_E2M1)}


def round_to(
    x: torch.Tensor,
    spec: FloatSpec,
    rounding: str = "nearest",
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """Round `x` onto `spec`'s grid; returns fp32 (NaN stays NaN; +-inf stays +-inf, or becomes
    +-max_value in a format without infinities)."""
    if rounding not in ROUNDINGS:
        raise ValueError(f"rounding must be one of {ROUNDINGS}, got {rounding!r}")
    x = x.float()
    if spec.mantissa_bits == 23:
        return x.clone()
    noise = stochastic_noise(x.shape, spec, generator, x.device) if rounding == "stochastic" else None
    return round_fp32(x, spec, noise)


Noise = tuple[torch.Tensor, torch.Tensor | None]


def stochastic_noise(shape, spec: FloatSpec, generator: torch.Generator | None = None, device=None) -> Noise:
    """The random numbers one stochastic rounding of a `shape` tensor onto `spec` consumes: uniform int32
    bits below the cut (in [0, 2**(23 - m))), then, for a format with its own subnormal grid, float64
    uniforms. Drawn in that order; a caller may draw many roundings' worth at once and slice it."""
    drop = 23 - spec.mantissa_bits
    if torch.compiler.is_compiling():  # traced: Inductor swaps any draw for its own generator
        bits = torch.randint(0, 1 << drop, shape, generator=generator, dtype=torch.int32, device=device)
    else:  # cut each 64-bit draw into four 16-bit (or two 32-bit) fields, each uniform
        field = torch.int16 if drop <= 16 else torch.int32
        n = math.prod(shape)
        words = torch.empty(-(-n // (8 // field.itemsize)), dtype=torch.int64, device=device)
        words.random_(-(2**63), None, generator=generator)  # the full 64-bit range
        bits = words.view(field)[:n].to(torch.int32).bitwise_and_((1 << drop) - 1).view(shape)
    if spec.min_exponent == -126:
        return bits, None
    return bits, torch.rand(shape, generator=generator, dtype=torch.float64, device=device)


def round_fp32(x: torch.Tensor, spec: FloatSpec, noise: Noise | None = None) -> torch.Tensor:
    """`round_to`'s arithmetic on an fp32 tensor: round half to even if `noise` is None, else stochastic
    rounding with `noise` from `stochastic_noise` (random numbers as tensors, not a generator, so it
    can be compiled)."""
    if spec.mantissa_bits == 23:
        return x
    drop = 23 - spec.mantissa_bits
    bits = x.view(torch.int32)
    low = (1 << drop) - 1
    if noise is None:  # round half to even: add 0.5ulp - 1 plus the lowest kept bit, then truncate
        out = (bits >> drop).bitwise_and_(1).add_(low >> 1).add_(bits)
    else:  # stochastic: add uniform random bits below the cut, then truncate
        out = bits + noise[0]
    out = out.bitwise_and_(~low).view(torch.float32)

    # Branch-free (no data-dependent control flow), so it traces under torch.compile.
    magnitude = x.abs()
    if spec.min_exponent > -126:  # fp32 subnormals already sit on bf16's subnormal grid
        tiny = magnitude < math.ldexp(1.0, spec.min_exponent)
        out = torch.where(tiny, _round_subnormal(x, spec, noise), out)
    if spec.saturate:
        out = out.clamp(-spec.max_value, spec.max_value)
    elif spec.min_exponent > -126:  # bf16 shares fp32's exponent range: overflow carries into inf
        out = torch.where(out.abs() > spec.max_value, out * math.inf, out)
    special = x if spec.infinities else x.clamp(-spec.max_value, spec.max_value)  # clamp keeps NaN
    return torch.where(magnitude < math.inf, out, special)  # NaN (never < inf) and +-inf


def _round_subnormal(x, spec, noise):
    """Round onto the fixed subnormal spacing 2**(min_exponent - m), exactly (stochastic: in float64)."""
    step = spec.smallest_subnormal
    if noise is None:  # scaling by a power of two is exact; torch.round is half-to-even
        return torch.round(x * (1 / step)) * step
    return torch.copysign(torch.floor(x.double().abs() / step + noise[1]) * step, x.double()).float()


def ulp(x: torch.Tensor, spec: FloatSpec) -> torch.Tensor:
    """Spacing of `spec`'s grid at |x| (the gap to the next representable magnitude), float64;
    +-inf and NaN give NaN.

    The exponent is read exactly (`frexp`) and the power of two built from its bit pattern:
    float64 `log2` is not exact at powers of two on every device (CUDA's gives log2(64) just
    below 6, which halved the gap there).
    """
    ax = x.double().abs().clamp_min(math.ldexp(1.0, spec.min_exponent))
    exponent = torch.frexp(ax).exponent.long() - 1 - spec.mantissa_bits  # |x| in [2^(e-1), 2^e)
    gap = ((exponent + 1023) << 52).view(torch.float64)  # within float64's normal range
    return torch.where(ax < math.inf, gap, math.nan)
