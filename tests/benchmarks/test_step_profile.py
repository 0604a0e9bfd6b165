"""The profiler breakdown of the latency benchmark: kernel names land in the right group, and the
group table adds up and measures each group against its floor."""

import math
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

from step_profile import OTHER, KernelTime, breakdown, group_of, profile_steps  # noqa: E402


@pytest.mark.parametrize(
    "name, group",
    [
        ("_fused_kda_decode_kernel", "KDA decode"),
        ("_mla_decode_split_kernel", "MLA decode"),
        ("_mla_decode_merge_kernel", "MLA decode"),
        ("_rmsnorm_gated_fp8_kernel", "gated RMSNorm + FP8 quant"),
        ("_per_token_fp8_quant_kernel", "gated RMSNorm + FP8 quant"),
        ("_rms_norm_kernel", "norms"),
        ("void cutlass::device_kernel<GroupProblemShape<...>>", "routed experts"),
        ("_moe_gemv_kernel", "routed experts"),
        ("sm90_xmma_gemm_e4m3bf16_e4m3f32_f32_tn_n_tilesize64x64x128", "FP8 GEMM"),
        ("nvjet_sm90_qqtst_128x128_128x6_1x1_h_bz_coopA_algo2_ovscale_TNT", "FP8 GEMM"),
        ("nvjet_tst_128x64_64x8_2x1_v_bz_TNT", "bf16 GEMM / GEMV"),
        ("void gemv2T_kernel_val<int, int, __nv_bfloat16>", "bf16 GEMM / GEMV"),
        ("Memcpy HtoD (Pinned -> Device)", "memcpy / memset"),
        ("void at::native::vectorized_elementwise_kernel<4, silu>", OTHER),
    ],
)
def test_kernel_names_land_in_their_group(name: str, group: str) -> None:
    assert group_of(name) == group


def test_breakdown_adds_up_and_measures_against_the_floor() -> None:
    kernels = [
        KernelTime("_fused_kda_decode_kernel", "KDA decode", 30.0, 20.0),
        KernelTime("nvjet_a", "bf16 GEMM / GEMV", 50.0, 100.0),
        KernelTime("nvjet_b", "bf16 GEMM / GEMV", 10.0, 20.0),
        KernelTime("elementwise", OTHER, 10.0, 300.0),
    ]
    # 4e9 B/s = 4e3 B/us: 120_000 B take 30 us, the KDA group's whole time.
    rows = breakdown(kernels, 100.0, {"KDA decode": 120_000, "MLA decode": 1}, copy_gbps=4.0)
    assert [r["group"] for r in rows] == ["bf16 GEMM / GEMV", "KDA decode", OTHER]
    assert rows[0]["us_per_step"] == 60.0 and rows[0]["pct_of_step"] == 60.0
    assert "pct_of_floor" not in rows[0]  # no floor given for the group
    assert math.isclose(rows[1]["floor_us"], 30.0) and math.isclose(rows[1]["pct_of_floor"], 100)
    assert math.isclose(sum(r["pct_of_step"] for r in rows), 100.0)


def test_profile_steps_counts_each_step_once() -> None:
    a, b = torch.ones(64, 64), torch.ones(64, 64)
    kernels = profile_steps(lambda: torch.mm(a, b), 3, torch.device("cpu"))
    (mm,) = [k for k in kernels if k.name == "aten::mm"]
    assert mm.calls_per_step == 1.0 and mm.group == "bf16 GEMM / GEMV" and mm.us_per_step > 0
    with pytest.raises(ValueError, match="steps must be >= 1"):
        profile_steps(lambda: None, 0, torch.device("cpu"))
