"""streamback.measure.kernels: Inductor's generated kernels counted, kernels grouped by kind, two
profiles compared (hand-made), and a profile of a real step."""

import pytest
import torch

from streamback.measure import kernels


@pytest.mark.parametrize(
    "name, kind",
    [
        ("triton_per_fused__to_copy_add_mean_mul_sub_sum_view_4", "triton:per"),
        ("triton_red_fused__to_copy__unsafe_view_add_mean_mul_pow_rsqrt_8", "triton:red"),
        ("triton_poi_fused__unsafe_view_add_12", "triton:poi"),
        ("cpp_fused__to_copy_add_mean_mul_pow_rsqrt_t_0", "cpp"),
        ("nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_NNT", "matmul"),
        ("cudnn_generated_fort_native_sdpa_sm90_flash_bprop_wgmma_f16_knob_26", "attention"),
        (
            "void at::native::vectorized_elementwise_kernel<8, at::native::FillFunctor<c10::BFloat16>, "
            "std::array<char*, 1ul> >",
            "fill",
        ),
        (
            "void at::native::unrolled_elementwise_kernel<at::native::CUDAFunctor_add<float>, std::array<char*, 3ul>, "
            "4>",
            "other",
        ),
        ("aten::mm", "matmul"),
    ],
)
def test_kind(name, kind):
    assert kernels.kind(name) == kind


def test_two_profiles_compared():
    a = {"kernels": {"triton_per_a": [1.5, 40.0], "nvjet_x": [10.0, 100.0]}, "busy_ms": 11.5, "wall_ms": 12.0}
    b = {
        "kernels": {"triton_red_b": [2.0, 40.0], "triton_per_a": [1.0, 40.0], "nvjet_x": [10.25, 100.0]},
        "busy_ms": 13.25,
        "wall_ms": 15.0,
    }
    assert kernels.kind_table(a, b) == [
        ["triton:red", "0.00", "2.00", "+2.00", "0", "40"],
        ["triton:per", "1.50", "1.00", "-0.50", "40", "40"],
        ["matmul", "10.00", "10.25", "+0.25", "100", "100"],
        ["busy (sum of kernels)", "11.50", "13.25", "+1.75", "", ""],
        ["step wall time", "12.00", "15.00", "+3.00", "", ""],
    ]
    assert kernels.top_differences(a, b, 2) == ["  +2.00 ms  0->40  triton_red_b", "  -0.50 ms  40->40  triton_per_a"]
    assert kernels.top_kernels(b, 2) == ["  10.25 ms   100  nvjet_x", "   2.00 ms    40  triton_red_b"]


def test_kernel_times_of_a_step_on_the_cpu():
    """On the CPU each operator's self time: a step of 3 matmuls has 3 mm calls per step."""
    a, b = torch.randn(64, 64), torch.randn(64, 64)
    profile = kernels.kernel_times(lambda: a @ b @ b @ b, 2, torch.device("cpu"))
    ms, launches = profile["kernels"]["aten::mm"]
    assert launches == 3 and ms > 0
    assert profile["busy_ms"] >= ms and profile["wall_ms"] > 0
    assert kernels.by_kind(profile["kernels"])["matmul"][1] == 3
