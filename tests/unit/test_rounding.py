"""streamback.model.rounding: nearest-even against torch's own casts, hand values, stochastic rounding's bias
and its random bits, the grid spacing against torch.nextafter; each on every device (conftest's `device`)."""

import math

import pytest
import torch

from streamback.model.rounding import (
    BF16,
    FP4_E2M1,
    FP8_E4M3,
    FP8_E5M2,
    FP16,
    FP32,
    SPECS,
    round_fp32,
    round_to,
    stochastic_noise,
    ulp,
)

NATIVE = [BF16, FP16, FP8_E4M3, FP8_E5M2]


def _values(spec, n=200_000, seed=0):
    """Random fp32 values of both signs spread log-uniformly over `spec`'s range, subnormals included."""
    g = torch.Generator().manual_seed(seed)
    low = spec.min_exponent - spec.mantissa_bits - 2
    high = math.log2(spec.max_value)
    exponent = low + (high - low) * torch.rand(n, generator=g, dtype=torch.float64)
    sign = torch.where(torch.rand(n, generator=g) < 0.5, -1.0, 1.0).double()
    x = (sign * torch.exp2(exponent)).float()
    return x[x.abs() <= spec.max_value]


@pytest.mark.parametrize("spec", NATIVE, ids=lambda s: s.name)
def test_nearest_matches_torch_casts(spec, device):
    x = _values(spec).to(device)
    ours = round_to(x, spec)
    theirs = x.to(spec.dtype).float()
    assert torch.equal(ours, theirs), (x[ours != theirs][:5], ours[ours != theirs][:5], theirs[ours != theirs][:5])


@pytest.mark.slow
def test_nearest_compiled_matches_torch_casts(device):
    """round_to under Inductor (the formats' code path in a compiled block): the same bits as
    torch's casts, every native format in one graph."""
    values = [_values(spec, n=50_000).to(device) for spec in NATIVE]
    torch._dynamo.reset()
    rounded = torch.compile(lambda xs: [round_to(x, spec) for x, spec in zip(xs, NATIVE)], fullgraph=True)(values)
    for spec, x, ours in zip(NATIVE, values, rounded):
        assert torch.equal(ours, x.to(spec.dtype).float()), spec.name
    torch._dynamo.reset()


def test_nearest_matches_bf16_cast_on_every_kind_of_bit_pattern(device):
    """Random 32-bit patterns: normals, fp32 subnormals, huge values that overflow to inf, NaNs."""
    bits = torch.randint(-(2**31), 2**31 - 1, (500_000,), generator=torch.Generator().manual_seed(1), dtype=torch.int64)
    x = bits.to(torch.int32).view(torch.float32).to(device)
    ours, theirs = round_to(x, BF16), x.to(torch.bfloat16).float()
    nan = torch.isnan(x)
    assert nan.any() and torch.isnan(ours[nan]).all()
    assert torch.equal(ours[~nan], theirs[~nan])


def test_hand_values_bf16():
    # At 600 the bf16 gap is 4: 602 is a tie and goes to the even 600; 602.1 goes up to 604.
    x = torch.tensor([600.0 + 2.0, 600.0 + 2.1, 604.0 + 2.0, 1.0 + 2**-8, 1.0 + 3 * 2**-8, 1024.0 + 3.9, 1024 + 4.0])
    expected = torch.tensor([600.0, 604.0, 608.0, 1.0, 1.0 + 2**-6, 1024.0, 1024.0])
    assert torch.equal(round_to(x, BF16), expected)
    assert torch.equal(
        ulp(torch.tensor([600.0, 1024.0, 1.0]), BF16), torch.tensor([4.0, 8.0, 2**-7], dtype=torch.float64)
    )


def test_hand_values_e2m1_grid():
    # E2M1 holds 0, 0.5, 1, 1.5, 2, 3, 4, 6 (and negatives); ties go to the even mantissa; it saturates at 6.
    x = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 7.0, 100.0, -0.3, -2.9, 0.24])
    expected = torch.tensor([0.0, 1.0, 1.0, 2.0, 2.0, 4.0, 4.0, 6.0, 6.0, -0.5, -3.0, 0.0])
    assert torch.equal(round_to(x, FP4_E2M1), expected)
    grid = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])
    assert torch.equal(round_to(grid, FP4_E2M1), grid) and torch.equal(round_to(-grid, FP4_E2M1), -grid)


def test_subnormals_fp16_and_bf16():
    step = 2.0**-24  # fp16's smallest subnormal
    x = torch.tensor([0.5, 1.5, 2.5, 2.6, 1023.5, 1024.49]) * step
    expected = torch.tensor([0.0, 2.0, 2.0, 3.0, 1024.0, 1024.0]) * step
    assert torch.equal(round_to(x, FP16), expected)
    tiny = torch.tensor([2.0**-133 * 0.5, 2.0**-133 * 1.5, 2.0**-140])  # bf16 subnormal step is 2**-133
    assert torch.equal(round_to(tiny, BF16), torch.tensor([0.0, 2.0**-132, 0.0]))


def test_nan_inf_and_range():
    special = torch.tensor([math.nan, math.inf, -math.inf])
    for spec in SPECS.values():
        for rounding in ("nearest", "stochastic"):
            out = round_to(special, spec, rounding)
            top = math.inf if spec.infinities else spec.max_value  # E4M3 and E2M1 have no inf
            assert torch.isnan(out[0]) and out[1] == top and out[2] == -top, (spec.name, rounding)
    assert [s.name for s in SPECS.values() if not s.infinities] == ["fp8_e4m3", "fp4_e2m1"]
    # a NaN whose payload lies wholly below the cut must not be truncated into an infinity
    quiet_low = torch.tensor([0x7F800001], dtype=torch.int32).view(torch.float32)
    assert torch.isnan(round_to(quiet_low, BF16)).all()
    assert torch.isnan(round_to(quiet_low, BF16, "stochastic")).all()
    # overflow: non-saturating formats go to inf, saturating ones clamp
    assert round_to(torch.tensor([65520.0]), FP16) == math.inf and round_to(torch.tensor([65519.0]), FP16) == 65504
    assert round_to(torch.tensor([3.4e38]), BF16) == math.inf
    assert round_to(torch.tensor([1000.0, -1e9]), FP8_E4M3).tolist() == [448.0, -448.0]
    assert round_to(torch.tensor([1e6]), FP8_E5M2).item() == 57344.0


@pytest.mark.parametrize("spec", [BF16, FP16, FP8_E4M3, FP8_E5M2, FP4_E2M1], ids=lambda s: s.name)
def test_stochastic_rounding_is_unbiased_and_within_one_ulp(spec, device):
    """Values strictly between two grid points (subnormal range included): over many draws the mean
    error of each is within 5 standard errors of zero, and no draw moves it by a gap or more."""
    g = torch.Generator(device=device).manual_seed(2)
    grid = round_to(_values(spec, n=4000, seed=3), spec)
    grid = grid[(grid != 0) & (grid.abs() < spec.max_value / 2)][:64].to(device)
    fraction = 0.05 + 0.9 * torch.rand(grid.shape, generator=g, dtype=torch.float64, device=device)
    gap = ulp(grid, spec)  # gap above |grid|
    values = (grid.double().sign() * (grid.double().abs() + fraction * gap)).float()
    draws = 20_000
    x = values.repeat(draws, 1)
    out = round_to(x, spec, "stochastic", generator=g)

    assert torch.equal(round_to(out, spec), out)  # every result lies on the grid ...
    assert ((out - x).abs() < gap.float()).all()  # ... less than a gap away: one of the two neighbours
    error = (out - x).double()
    z = error.mean(0) / (error.std(0) / math.sqrt(draws))
    assert z.abs().max() < 5, z.abs().max()


def test_stochastic_rounding_mean_at_600_in_bf16():
    """600 + 1 in bf16 (gap 4) rounds up to 604 one time in four."""
    out = round_to(torch.full((400_000,), 601.0), BF16, "stochastic", torch.Generator().manual_seed(4))
    assert set(out.unique().tolist()) == {600.0, 604.0}
    up = (out == 604.0).double().mean().item()
    assert abs(up - 0.25) < 5 * math.sqrt(0.25 * 0.75 / out.numel())


@pytest.mark.parametrize("spec", [BF16, FP16, FP8_E4M3], ids=lambda s: s.name)
def test_random_bits_are_uniform_below_the_cut(spec):
    """Each of the 23 - m bits below the cut is 1 half the time (16-bit and 32-bit fields of the
    64-bit draws alike, the fields' sign bits included) and nothing lies above the cut."""
    drop = 23 - spec.mantissa_bits
    bits, uniforms = stochastic_noise((1001, 99), spec, torch.Generator().manual_seed(6))
    assert bits.dtype == torch.int32 and bits.shape == (1001, 99) and (uniforms is None) == (spec is BF16)
    assert bits.min() >= 0 and bits.max() < 2**drop
    ones = torch.stack([(bits >> k) & 1 for k in range(drop)]).double().mean(dim=(1, 2))
    assert ((ones - 0.5).abs() < 5 * 0.5 / math.sqrt(bits.numel())).all(), ones


def test_stochastic_rounding_with_given_bits():
    """No random bits truncate (towards zero); all of them round up anything off the grid."""
    x = torch.tensor([601.0, -601.0, 600.0, 603.9, 1.0 + 2**-9])
    zero, full = torch.zeros(5, dtype=torch.int32), torch.full((5,), 2**16 - 1, dtype=torch.int32)
    assert round_fp32(x, BF16, (zero, None)).tolist() == [600.0, -600.0, 600.0, 600.0, 1.0]
    assert round_fp32(x, BF16, (full, None)).tolist() == [604.0, -604.0, 600.0, 604.0, 1.0 + 2**-7]


@pytest.mark.parametrize("spec", [FP32, BF16, FP16, FP8_E4M3, FP8_E5M2, FP4_E2M1], ids=lambda s: s.name)
def test_ulp_against_nextafter(spec, device):
    """ulp(x) = the gap from |x| to the next larger value of the format: torch.nextafter's fp32 gap
    at |x| times 2^(23 - m) (the format's binades are fp32's), or the subnormal spacing below the
    smallest normal. At every power of two in range (where a float64 log2 is inexact on CUDA), just
    below each, and at random values; and for bf16/fp16 also nextafter in that dtype itself."""
    powers = torch.exp2(
        torch.arange(spec.min_exponent - spec.mantissa_bits, math.floor(math.log2(spec.max_value)) + 1).double()
    ).float()
    below = torch.nextafter(powers, torch.zeros(()))
    x = torch.cat([powers, below, _values(spec, n=20_000, seed=5)])
    x = torch.cat([x, -x]).to(device)
    ax = x.abs()
    fp32_gap = (torch.nextafter(ax, torch.full((), math.inf, device=device)) - ax).double()
    expected = torch.where(
        ax >= 2.0**spec.min_exponent,
        fp32_gap * 2.0 ** (23 - spec.mantissa_bits),
        2.0 ** (spec.min_exponent - spec.mantissa_bits),
    )
    got = ulp(x, spec)
    assert got.device == x.device and got.dtype == torch.float64
    assert torch.equal(got, expected), (x[got != expected][:5], got[got != expected][:5], expected[got != expected][:5])
    if spec in (BF16, FP16):  # directly in the dtype: the gap above each value on its grid
        grid = x.to(spec.dtype)
        grid = grid[grid.abs() < spec.max_value]
        step = (
            torch.nextafter(grid.abs(), torch.full((), math.inf, dtype=spec.dtype, device=device)).double()
            - grid.abs().double()
        )
        assert torch.equal(ulp(grid.float(), spec), step)
    assert torch.isnan(ulp(torch.tensor([math.inf, -math.inf, math.nan], device=device), spec)).all()


def test_fp8_e4m3_has_no_infinity_like_torchs_cast(device):
    """E4M3 has no inf encoding: +-inf and finite overflow both become +-448 (OCP's satfinite, PTX
    cvt.satfinite; torch's float8_e4m3fn cast on the CPU does the same, while on CUDA, torch 2.11, it
    gives NaN for |x| >= 480, so it is the reference only in range); NaN stays NaN. The stream
    format then refuses inf as off its grid. E5M2 has infinities and keeps them (as torch's cast does)."""
    x = torch.tensor([math.inf, -math.inf, math.nan, 1e30, -500.0, 464.0, 448.0, 1.0], device=device)
    ours = round_to(x, FP8_E4M3)
    assert ours[:2].tolist() == [448.0, -448.0] and torch.isnan(ours[2])
    assert ours[3:].tolist() == [448.0, -448.0, 448.0, 448.0, 1.0]  # 464 is E4M3's midpoint of 448 and 480: to even
    in_range = x.abs() < 464
    assert torch.equal(ours[in_range], x[in_range].to(torch.float8_e4m3fn).float())
    if device.type == "cpu":  # torch's CPU cast saturates as the format does
        keep = ~torch.isnan(x)
        assert torch.equal(ours[keep], x[keep].to(torch.float8_e4m3fn).float())
    for rounding in ("nearest", "stochastic"):
        assert round_to(x[:2], FP8_E4M3, rounding).tolist() == [448.0, -448.0]
    e5m2 = round_to(x[:2], FP8_E5M2)
    assert torch.equal(e5m2, x[:2].to(torch.float8_e5m2).float()) and e5m2.tolist() == [math.inf, -math.inf]

    from streamback.model.formats import StreamFormat

    fmt = StreamFormat("fp8_e4m3")
    inf = torch.full((2, 8), math.inf, device=device)
    assert not fmt.is_representable(inf.to(fmt.container_dtype))
    assert fmt.enter(inf).eq(448.0).all() and fmt.add(fmt.enter(torch.zeros(2, 8, device=device)), inf).eq(448.0).all()
