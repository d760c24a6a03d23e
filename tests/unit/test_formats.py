"""Residual-stream formats: hand-computed MX/NVFP4 values, peer references, SR bias, dtypes, gradients."""

from fractions import Fraction

import numpy as np
import pytest
import torch

from streamback.errors import StreambackError
from streamback.model.formats import StreamFormat, quantize_mx, quantize_nvfp4
from streamback.model.rounding import FP8_E4M3, FP8_E5M2, round_to

from helpers.formats import ALL, one_block, sr_inputs, sr_verdict

STOCHASTIC = [f for f in ALL if f.rounding == "stochastic"]
IDS = [f.label for f in ALL]
NAN = float("nan")


# ---------------------------------------------------------------- parsing


@pytest.mark.parametrize(
    "text, name, rounding",
    [
        ("bf16", "bf16", "nearest"),
        ("BF16_SR", "bf16", "stochastic"),
        (" mxfp8:stochastic ", "mxfp8", "stochastic"),
        ("nvfp4:nearest", "nvfp4", "nearest"),
        ("fp8_e4m3_sr", "fp8_e4m3", "stochastic"),
        ("fp8_e5m2", "fp8_e5m2", "nearest"),
    ],
)
def test_parse(text, name, rounding):
    assert StreamFormat.parse(text) == StreamFormat(name, rounding)


def test_parse_round_trips_labels():
    assert [StreamFormat.parse(f.label) for f in ALL] == ALL
    assert len({f.label for f in ALL}) == len(ALL)


@pytest.mark.parametrize("text", ["bf17", "bf16:floor", "mxfp8_rne", "", "fp16:"])
def test_parse_error_names_the_value(text):
    with pytest.raises(StreambackError, match=repr(text).replace("[", r"\[")):
        StreamFormat.parse(text)


def test_fp32_has_no_stochastic_variant():
    for text in ("fp32_sr", "fp32:stochastic"):
        with pytest.raises(StreambackError, match="'fp32' has no stochastic"):
            StreamFormat.parse(text)


def test_constructor_errors_name_the_value():
    with pytest.raises(StreambackError, match="'mxfp9'"):
        StreamFormat("mxfp9")
    with pytest.raises(StreambackError, match="'sr'"):
        StreamFormat("bf16", "sr")


# ---------------------------------------------------------------- MXFP8 hand values (OCP MX v1.0)


def test_mx_hand_values_shared_exponent_and_ties():
    # amax = 100: floor(log2 100) = 6, shared exponent 6 - emax_elem(8) = -2, X = 0.25.
    #   1.0 / X = 4 -> E4M3 4 -> 1.0
    #   0.3 / X = 1.2 -> [1, 2) has step 1/8: 1.125 | 1.25 -> 1.25 -> 0.3125
    #  -2.5 / X = -10 -> exact -> -2.5
    #   100 / X = 400 -> [256, 512) has step 32: 384 | 416, a tie -> even mantissa (384 = 1.100b * 2^8) -> 96
    out = quantize_mx(one_block([1.0, 0.3, -2.5, 100.0], 32))
    assert out[:4].tolist() == [1.0, 0.3125, -2.5, 96.0]
    assert out[4:].eq(0).all()


def test_mx_hand_values_saturation_and_subnormal_elements():
    # amax = 500: floor(log2 500) = 8, X = 2^0 = 1.
    #   +-500 -> above 448 (E4M3's max normal) -> saturates to +-448
    #   470 -> nearest 3-bit-mantissa neighbour is 480, which E4M3 lacks -> 448
    #   0.01 -> E4M3 subnormal grid 2^-9: 0.01 / 2^-9 = 5.12 -> 5 * 2^-9 = 0.009765625
    #   0.0009 -> 0.46 * 2^-9 -> 0
    out = quantize_mx(one_block([500.0, -500.0, 470.0, 0.01, 0.0009], 32))
    assert out[:5].tolist() == [448.0, -448.0, 448.0, 5 * 2.0**-9, 0.0]


def test_mx_shared_exponent_is_exact_below_a_power_of_two():
    # amax = 32 - ulp: floor(log2) = 4 (fp32 log2 would round to 5), X = 2^-4;
    # amax / X = 512 - 2^-5 -> saturates to 448 -> 28. With X = 2^-3 it would be 32.
    below_32 = float(np.nextafter(np.float32(32), np.float32(0)))
    assert quantize_mx(one_block([below_32], 32))[0].item() == 28.0


def test_mx_e8m0_range():
    # amax = 2^-120: shared exponent -128 is below E8M0's -127, so X = 2^-127.
    #   2^-120 / X = 128 -> 2^-120; 3 * 2^-137 / X = 1.5 * 2^-9 (E4M3 subnormal) -> tie -> 2 * 2^-9 -> 2^-135
    #   (with the unclamped X = 2^-128 the second would have stayed 3 * 2^-137)
    out = quantize_mx(one_block([2.0**-120, 3 * 2.0**-137], 32))
    assert out[:2].tolist() == [2.0**-120, 2.0**-135]
    # amax = 3e38: floor(log2) = 127, X = 2^119 (largest reachable scale); 3e38 / X = 451.4 -> 448;
    # 1.0 / X = 2^-119 -> flushes to 0
    out = quantize_mx(one_block([3e38, 1.0], 32))
    assert out[:2].tolist() == [448 * 2.0**119, 0.0]


def test_mx_zeros_nan_and_inf_blocks():
    x = torch.cat(
        [one_block([], 32), one_block([NAN, 1.0], 32), one_block([float("inf"), 1.0], 32), one_block([-6.0, 0.75], 32)]
    )
    out = quantize_mx(x)
    assert out[:32].eq(0).all() and not out[:32].isnan().any()  # all-zero block
    assert out[32:96].isnan().all()  # NaN / Inf amax -> NaN scale -> every element NaN
    assert out[96:98].tolist() == [-6.0, 0.75]  # blocks are independent


def _mx_reference(x):
    """Peer MX: frexp for the exponent, torch's native float8_e4m3fn cast for the elements."""
    width = x.shape[-1]
    blocks = torch.nn.functional.pad(x, (0, -width % 32)).double().unflatten(-1, (-1, 32))
    amax = blocks.abs().amax(-1, keepdim=True)
    _, exponent = torch.frexp(amax)  # amax = m * 2^e with m in [0.5, 1): floor(log2 amax) = e - 1
    scale = torch.ldexp(torch.ones_like(amax), (exponent - 1 - 8).clamp(min=-127))
    elements = (blocks / scale).clamp(-448, 448).float().to(torch.float8_e4m3fn).double()
    out = torch.where(amax.isfinite(), elements * scale, NAN)
    return out.flatten(-2)[..., :width].float()


def test_mx_matches_peer_reference_over_magnitudes():
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(64, 72, generator=gen) * torch.exp2(torch.randint(-130, 120, (64, 1), generator=gen).float())
    x[3, 5] = NAN
    ours = quantize_mx(x)
    # exact
    torch.testing.assert_close(ours, _mx_reference(x), rtol=0, atol=0, equal_nan=True)
    # the short last block (72 = 2 x 32 + 8) is quantised as a block of its own
    # exact
    torch.testing.assert_close(ours[:, 64:], quantize_mx(x[:, 64:].contiguous()), rtol=0, atol=0, equal_nan=True)


# ---------------------------------------------------------------- NVFP4 hand values


def test_nvfp4_hand_values_unit_tensor_scale():
    # tensor amax 2688 -> tensor scale 2688 / (448 * 6) = 1 (exact in 18 bits).
    # block 0: amax 2688 -> block scale E4M3(2688 / 6) = 448; 2688 / 448 = 6 -> 2688.
    # block 1: amax 30 -> block scale E4M3(5) = 5.   30/5 = 6 -> 30;  7/5 = 1.4 -> 1.5 -> 7.5;
    #          -12/5 = -2.4 -> -2 -> -10;  2.5/5 = 0.5 -> 2.5;  1.2/5 = 0.24 -> 0 (below 0.25)
    # block 2: amax 100 -> 100/6 = 16.67 -> E4M3 step 2 in [16, 32) -> 16 (rounded down);
    #          100/16 = 6.25 -> clips to 6 -> 96;  20/16 = 1.25, tie 1 | 1.5 -> even 1 -> 16
    # block 3: amax 1e-4 -> 1e-4/6 = 1.7e-5 < half E4M3's smallest subnormal 2^-9 -> scale 0 -> zeros
    x = torch.cat(
        [
            one_block([2688.0], 16),
            one_block([30, 7, -12, 2.5, 1.2], 16),
            one_block([100, 20], 16),
            one_block([1e-4], 16),
        ]
    )
    out = quantize_nvfp4(x)
    assert out[0].item() == 2688.0 and out[1:16].eq(0).all()
    assert out[16:21].tolist() == [30.0, 7.5, -10.0, 2.5, 0.0]
    assert out[32:34].tolist() == [96.0, 16.0]
    assert out[48:].eq(0).all()


def test_nvfp4_hand_values_fractional_tensor_scale():
    # tensor amax 6 -> tensor scale 6 / 2688 = 2^-9 * 8/7, kept to 18 significant bits:
    # s = round(8/7 * 2^17) * 2^-26 = 149797 * 2^-26.
    s = Fraction(149797, 2**26)
    # block 0: amax 6 -> E4M3(6 / 6 / s) = E4M3(447.99..) = 448; 6 / (448 s) = 5.99998 -> 6 -> 2688 s;
    #          1 / (448 s) = 0.99999 -> 1 -> 448 s
    # block 1: amax 0.9 -> 0.9 / 6 / s = 67.2 -> E4M3 step 8 in [64, 128) -> 64;
    #          0.9 / (64 s) = 6.3 -> 6 -> 384 s;  -0.3 / (64 s) = -2.1 -> -2 -> -128 s
    x = torch.cat([one_block([6.0, 1.0], 16), one_block([0.9, -0.3], 16)])
    out = quantize_nvfp4(x)
    assert out[:2].tolist() == [float(2688 * s), float(448 * s)]
    assert out[16:18].tolist() == [float(384 * s), float(-128 * s)]


def test_nvfp4_zeros_nan_and_tiny_blocks():
    assert quantize_nvfp4(torch.zeros(3, 32)).eq(0).all()
    # NaN / Inf blocks become NaN and stay out of the tensor amax (3 here: scale 3/2688 etc.)
    x = torch.cat([one_block([NAN, 1.0], 16), one_block([0.5, float("inf")], 16), one_block([3.0, -1.5], 16)])
    out = quantize_nvfp4(x)
    assert out[:32].isnan().all()
    # derived: decoding multiplies an e2m1 value by the fp32 tensor scale and the e4m3 block scale (3/2688 rounded): a
    # few fp32 roundings (2^-24 each), 2^-17 holds 128
    torch.testing.assert_close(out[32:34], torch.tensor([3.0, -1.5]), rtol=2.0**-17, atol=0)


def _nvfp4_recipe(x):
    """NVIDIA's NVFP4 recipe written out directly, as Transformer Engine's reference quantiser does
    it (fp32 arithmetic, torch's saturating float8_e4m3fn cast, E2M1 by its midpoint table with
    ties to even): the E4M3 block scales b, the E2M1 codes q, and the exact values q * b *
    fp32(amax_tensor / 2688) (float64), for x [rows, 16 * k]."""
    x = x.float()
    blocks = x.unflatten(-1, (-1, 16))
    fp32_max = torch.tensor(torch.finfo(torch.float32).max, device=x.device)
    amax = x.abs().max()
    encode = torch.min(torch.div(torch.tensor(448.0 * 6.0, device=x.device), amax), fp32_max)
    decode = torch.div(1.0, encode)
    b = torch.min(torch.div(blocks.abs().amax(-1, keepdim=True), 6.0) * encode, fp32_max)
    b = b.clamp(-448, 448).to(torch.float8_e4m3fn).float()
    scaled = (blocks * torch.min(torch.div(1.0, b * decode), fp32_max)).clamp(-6, 6)
    bounds = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0], device=x.device)
    values = torch.tensor([0, 0.5, 1, 1.5, 2, 3, 4, 6], device=x.device)
    index = torch.bucketize(scaled.abs(), bounds)  # at a midpoint, the lower value ...
    tie = torch.isin(scaled.abs(), bounds[1::2])  # ... but 0.75, 1.75, 3.5 go up to the even one
    q = torch.copysign(values[index + tie.long()], scaled)
    exact = q.double() * b.double() * (amax / 2688.0).double()  # the decode scale the recipe's GEMM applies (fp32)
    return b, q, exact.flatten(-2)


def test_nvfp4_matches_nvidias_recipe(device):
    """Element codes and block scales equal the recipe's bit for bit, and the values differ from
    its q * b * amax / 2688 only by the one per-tensor factor of the 18-bit decode scale (< 2^-18):
    1.6M random elements over 2^-12 .. 2^12 per row (E4M3-subnormal and zero block scales
    included), blocks placed across an E4M3 rounding midpoint (where computing the block scale by
    dividing by a rounded tensor scale, as this code once did, lands on the other side), and a
    tensor so small that its decode scale is an fp32 subnormal."""
    gen = torch.Generator().manual_seed(2)
    random = torch.randn(1600, 1024, generator=gen) * torch.exp2(
        torch.randint(-12, 12, (1600, 1), generator=gen).float()
    )
    # amax 6: S = 448, so a block of amax v gets b = E4M3(v / 6 * 448); 68 is the midpoint of 64 and 72
    mid = 68.0 * 6 / 448
    near = torch.nextafter(torch.full((64,), mid), torch.tensor(0.0))
    for k in range(1, 64):
        near[k] = torch.nextafter(near[k - 1], torch.tensor(1.0))
    crossing = torch.zeros(64, 16)
    crossing[:, 0], crossing[0, 1], crossing[:, 2] = near, 6.0, near / 3
    tiny = torch.randn(8, 32, generator=gen) * 1e-36
    for name, x in (("random", random), ("crossing", crossing), ("tiny", tiny)):
        x = x.to(device)  # on CUDA a new tensor: the case goes by its name
        ours = quantize_nvfp4(x)
        b, q, exact = _nvfp4_recipe(x)
        if name != "tiny":
            s = (
                float(quantize_nvfp4(x.abs().max().reshape(1, 1).expand(1, 16).contiguous())[0, 0]) / 2688
            )  # the 18-bit decode scale
            assert torch.equal(
                ours.double(), (q.double() * b.double() * s).flatten(-2)
            )  # the recipe's codes, bit for bit
            assert abs(s / (x.abs().max().double().item() / 2688) - 1) < 2.0**-18
        else:  # decode scale subnormal: kept as it is, so values are the recipe's up to fp32's subnormal spacing
            assert ((ours.double() - exact).abs() <= 2.0**-146).all()
    b, _, _ = _nvfp4_recipe(crossing)
    assert set(b[1:, 0, 0].tolist()) == {64.0, 72.0}  # the blocks do straddle the midpoint


# ---------------------------------------------------------------- stochastic rounding


@pytest.mark.parametrize("fmt", STOCHASTIC, ids=[f.label for f in STOCHASTIC])
def test_stochastic_rounding_is_unbiased(fmt, device):
    torch.manual_seed(3)
    h, exact = sr_inputs(fmt, 4000, device)
    sr_verdict(fmt, fmt.add(h, exact), exact)


def test_nearest_is_deterministic():
    x = torch.randn(4, 64)
    for fmt in ALL:
        if fmt.rounding == "nearest":
            assert torch.equal(fmt.enter(x), fmt.enter(x))


# ---------------------------------------------------------------- dtype and grid invariants


@pytest.mark.parametrize("fmt", ALL, ids=IDS)
def test_add_dtype_and_grid_eager(fmt):
    torch.manual_seed(4)
    h = fmt.enter(torch.randn(2, 3, 72) * 4)  # 72: MX and NVFP4 end in a short block
    assert h.dtype == fmt.container_dtype and fmt.is_representable(h)
    for step in range(4):
        delta = torch.randn(2, 3, 72) * 0.3
        h = fmt.add(h, delta.bfloat16() if step % 2 else delta)  # bf16 (baseline) or fp32 (StreamBack) deltas
        assert h.dtype == fmt.container_dtype and fmt.is_representable(h)
    # a stream tensor of the wrong dtype is brought back to the container
    assert fmt.add(h.double(), delta).dtype == fmt.container_dtype


@pytest.mark.parametrize("fmt", [f for f in ALL if f.name not in ("fp32", "bf16", "fp16")], ids=lambda f: f.label)
def test_is_representable_dtype_rejects_off_grid_values(fmt):
    x = torch.randn(4, 64)
    assert not fmt.is_representable(x.to(fmt.container_dtype))
    assert not fmt.is_representable(fmt.enter(x).double())
    assert fmt.is_representable(torch.full((4, 64), NAN, dtype=fmt.container_dtype))


def test_is_representable_dtype_native():
    # a native format's grid is its dtype: only the dtype can be wrong
    for fmt in ALL:
        if fmt.name in ("fp32", "bf16", "fp16"):
            assert fmt.is_representable(torch.randn(8).to(fmt.container_dtype))
            assert not fmt.is_representable(torch.randn(8, dtype=torch.float64))


def test_container_dtype_choice():
    # bf16 holds every fp8 value exactly (subnormals included) ...
    x = torch.randn(64, 64) * torch.exp2(torch.randint(-20, 20, (64, 1)).float())
    for spec in (FP8_E4M3, FP8_E5M2):
        on_grid = round_to(x, spec)
        assert torch.equal(on_grid.bfloat16().float(), on_grid)
    # ... but not every MXFP8 value (scale 2^-127 puts elements down to 2^-136, below bf16's 2^-133)
    mx = quantize_mx(one_block([2.0**-120, 2.0**-136], 32))
    assert mx[1].item() == 2.0**-136 and not torch.equal(mx.bfloat16().float(), mx)
    # ... nor NVFP4's (element x block scale x an 18-bit tensor scale)
    nv = quantize_nvfp4(torch.randn(4, 64))
    assert not torch.equal(nv.bfloat16().float(), nv)


# ---------------------------------------------------------------- straight-through gradient


@pytest.mark.parametrize("fmt", ALL, ids=IDS)
def test_gradient_passes_straight_through(fmt):
    x = (torch.randn(3, 40) * 4).requires_grad_()
    h = fmt.enter(x)
    h.float().sum().backward()
    assert torch.equal(x.grad, torch.ones_like(x))

    h = fmt.enter(torch.randn(3, 40)).detach().requires_grad_()
    d = torch.randn(3, 40).requires_grad_()
    fmt.add(h, d).float().sum().backward()
    assert h.grad.dtype == fmt.container_dtype and torch.equal(h.grad.float(), torch.ones(3, 40))
    assert torch.equal(d.grad, torch.ones_like(d))
