"""The profiler breakdown of the latency benchmark: kernel names land in the right group, and the
group table adds up and measures each group against its floor."""

import math
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

from step_profile import (  # noqa: E402
    OTHER,
    DeviceGaps,
    GapSite,
    KernelTime,
    breakdown,
    critical_path_us,
    device_gaps,
    group_of,
    profile_steps,
)


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
        (
            "void pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits<192, 128, 64>>",
            "MLA prefill attention",
        ),
        ("fmha_cutlassF_bf16_aligned_64x128_rf_sm80", "MLA prefill attention"),
        ("aten::_scaled_dot_product_flash_attention_for_cpu", "MLA prefill attention"),
        ("chunk_gated_delta_rule_fwd_kernel_h_blockdim64", "KDA prefill (fla)"),
        ("chunk_kda_fwd_kernel_intra_sub_chunk", "KDA prefill (fla)"),
        ("chunk_gla_fwd_kernel_o", "KDA prefill (fla)"),
        ("recompute_w_u_fwd_kernel", "KDA prefill (fla)"),
        ("l2norm_fwd_kernel", "KDA prefill (fla)"),
        ("fused_moe_kernel", "routed experts"),
        (
            "ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)",
            "TP collectives",
        ),
        ("ncclDevKernel_AllGather_RING_LL(ncclDevKernelArgsStorage<4096ul>)", "TP collectives"),
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


def test_prefill_floor_is_the_larger_of_bytes_and_flops() -> None:
    kernels = [
        KernelTime("fused_moe_kernel", "routed experts", 400.0, 10.0),
        KernelTime("nvjet_a", "bf16 GEMM / GEMV", 100.0, 10.0),
        KernelTime("flash_fwd_kernel", "MLA prefill attention", 50.0, 2.0),
        KernelTime("chunk_gla_fwd_kernel_o", "KDA prefill (fla)", 50.0, 2.0),
    ]
    # Copy 4e3 B/us, peak 1 TFLOP/s = 1e6 FLOP/us. Experts: 400_000 B = 100 us, 2e8 FLOPs =
    # 200 us -> FLOP-bound at 200 us (50% of 400). GEMMs: 200 us of bytes beat 50 us of FLOPs.
    rows = breakdown(
        kernels, 1000.0,
        {"routed experts": 400_000, "bf16 GEMM / GEMV": 800_000}, copy_gbps=4.0,
        floor_flops={"routed experts": 2e8, "bf16 GEMM / GEMV": 5e7,
                     "MLA prefill attention": 2.5e7},
        peak_tflops=1.0,
    )  # fmt: skip
    by = {r["group"]: r for r in rows}
    assert by["routed experts"]["bound"] == "FLOPs"
    assert math.isclose(by["routed experts"]["floor_us"], 200.0)
    assert math.isclose(by["routed experts"]["pct_of_floor"], 50.0)
    assert by["bf16 GEMM / GEMV"]["bound"] == "bytes"
    assert math.isclose(by["bf16 GEMM / GEMV"]["pct_of_floor"], 200.0)
    assert by["MLA prefill attention"]["bound"] == "FLOPs"
    assert "floor_us" not in by["KDA prefill (fla)"]
    assert math.isclose(sum(r["pct_of_step"] for r in rows), 60.0)
    with pytest.raises(ValueError, match="needs peak_tflops"):
        breakdown(kernels, 1000.0, {}, 4.0, floor_flops={"routed experts": 1.0})


def test_profile_steps_counts_each_step_once() -> None:
    a, b = torch.ones(64, 64), torch.ones(64, 64)
    kernels = profile_steps(lambda: torch.mm(a, b), 3, torch.device("cpu"))
    (mm,) = [k for k in kernels if k.name == "aten::mm"]
    assert mm.calls_per_step == 1.0 and mm.group == "bf16 GEMM / GEMV" and mm.us_per_step > 0
    with pytest.raises(ValueError, match="steps must be >= 1"):
        profile_steps(lambda: None, 0, torch.device("cpu"))


def test_device_gaps_split_short_and_long_idle_per_step() -> None:
    # Two steps: kernels a 0-10, b 12-20 (gap 2), c 15-18 inside b (no gap), d 60-70 (gap 40
    # after b, not c), e 71-80 (gap 1), f 105-106 (gap 25 after e).
    intervals = [(60.0, 70.0, "d"), (0.0, 10.0, "a"), (12.0, 20.0, "b"), (15.0, 18.0, "c"),
                 (71.0, 80.0, "e"), (105.0, 106.0, "f")]  # fmt: skip
    gaps = device_gaps(intervals, 2)
    assert gaps == DeviceGaps(
        short_us=1.5, short_count=1.0, long_us=32.5, long_count=1.0,
        long_sites=(GapSite("b", "d", 0.5, 20.0), GapSite("e", "f", 0.5, 12.5)),
    )  # fmt: skip
    assert device_gaps(intervals, 2, top_sites=1).long_sites == (GapSite("b", "d", 0.5, 20.0),)
    assert device_gaps([], 1) == DeviceGaps(0.0, 0.0, 0.0, 0.0)


def test_critical_path_counts_overlapping_kernels_once() -> None:
    """Serial kernels keep their durations; a kernel that started early (programmatic dependent
    launch) counts only past the end of the one before it, one inside another counts nothing, and
    the times add up to the busy time."""
    intervals = [
        (30.0, 32.0, "c"), (0.0, 10.0, "a"), (8.0, 25.0, "b"), (12.0, 20.0, "inside"),
        (21.0, 27.0, "past b"),
    ]  # fmt: skip
    assert critical_path_us(intervals) == [
        ("a", 10.0), ("b", 15.0), ("inside", 0.0), ("past b", 2.0), ("c", 2.0),
    ]  # fmt: skip
    assert sum(us for _, us in critical_path_us(intervals)) == 10 + 15 + 2 + 2
    serial = [(0.0, 3.0, "x"), (4.0, 9.0, "y")]
    assert critical_path_us(serial) == [("x", 3.0), ("y", 5.0)]
