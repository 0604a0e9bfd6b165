"""Where a decode step's or a prefill's device time goes: the kernels of a few engine steps under
`torch.profiler`, grouped by what they do, each group against the bytes it must move and, for a
prefill, the FLOPs it must compute (issue 12's profiler breakdown).

The profiler records the kernels of a CUDA-graph replay like eager ones (CUPTI sees graph
nodes), so the steps profiled are the ones the latency benchmark times. Kernel names are matched
against `CATEGORIES` in order; the first pattern that matches names the group. A group's floor is
the bytes it must read or write at least once per step (the routed experts the router chose and a
shared expert their kernels run, the KDA state, the MLA cache, the weights of the dense linears)
at the copy bandwidth of the run; groups whose traffic is activations only have no floor. A
prefill group's floor is the larger of its bytes at the copy bandwidth and its FLOPs at the
run's bf16 matmul peak. On the CPU (the benchmarks' `--dry-run`) the profiler's CPU operators
stand in for kernels, so the code path runs without a GPU.
"""

import re
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile

# (group, pattern over the kernel name), first match wins. Triton kernels carry the names of the
# fork's functions; cuBLAS / CUTLASS kernels carry their library's names (nvjet, gemv, cutlass,
# xmma), FP8 ones an e4m3 / f8 tag.
CATEGORIES: list[tuple[str, str]] = [
    # Tensor parallelism's collectives: NCCL's kernels (ncclDevKernel_AllReduce_Sum_bf16_RING_LL,
    # ..._AllGather_...). On rank 0, the profiled rank, their time includes waiting for the other
    # ranks to reach them: a late rank shows here, not in "other".
    ("TP collectives", r"nccl|all_?reduce|all_?gather"),
    ("routed experts", r"moe|grouped|GroupProblemShape"),
    ("MLA decode", r"mla_decode"),
    ("KDA decode", r"kda_decode"),
    # torch's fused attention: flash (flash_fwd), memory-efficient (fmha_cutlassF), cuDNN; on the
    # CPU its aten operators.
    ("MLA prefill attention", r"flash_fwd|fmha|attention_kernel|cudnn.*(sdpa|attn)|scaled_dot"),
    # fla-core's chunked KDA (gate cumsum, intra-chunk WY solve, state recurrence, output).
    (
        "KDA prefill (fla)",
        r"chunk_|gated_delta|recompute_w_u|solve_tril|merge_16x16|l2norm|wy_fast",
    ),
    ("gated RMSNorm + FP8 quant", r"rmsnorm_gated|per_token_fp8|fp8_per_token"),
    # cuBLASLt's FP8 kernels on sm90 are named nvjet_..._qqtst_..._ovscale_... (two quantized
    # operands, output scale).
    ("FP8 GEMM", r"e4m3|f8f8|fp8|_f8_|qqtst|ovscale"),
    ("bf16 GEMM / GEMV", r"gemm|gemv|nvjet|cutlass|xmma|sm90|matmul|aten::mm|aten::addmm"),
    ("norms", r"rms_norm|rmsnorm|layer_norm"),
    ("memcpy / memset", r"[Mm]emcpy|[Mm]emset"),
]
OTHER = "other (elementwise, routing, sampling)"


@dataclass(frozen=True)
class KernelTime:
    name: str
    group: str
    us_per_step: float
    calls_per_step: float


def group_of(name: str) -> str:
    """The `CATEGORIES` group of a kernel name (case-insensitive), or `OTHER`."""
    for group, pattern in CATEGORIES:
        if re.search(pattern, name, flags=re.IGNORECASE):
            return group
    return OTHER


# Idle device time between two kernels up to this long is the launch latency inside a graph or
# a busy stream; longer, the device is waiting on the host (input staging, a graph's launch, a
# sync, the host's work between steps).
GAP_SPLIT_US = 20.0


@dataclass(frozen=True)
class GapSite:
    """Where the device waited on the host: the kernel it finished last before a long gap and the
    one it started next, with the number and length of such gaps per step."""

    before: str
    after: str
    count: float
    us: float


@dataclass(frozen=True)
class DeviceGaps:
    """Idle device time per step between the profiled kernels (and copies), split at
    `GAP_SPLIT_US`: `short_us` in `short_count` gaps, `long_us` in `long_count`; `long_sites`,
    the long gaps by the kernels around them (longest total first, at most `top_sites`)."""

    short_us: float
    short_count: float
    long_us: float
    long_count: float
    long_sites: tuple[GapSite, ...] = ()


def device_gaps(
    intervals: list[tuple[float, float, str]], steps: int, top_sites: int = 8
) -> DeviceGaps:
    """Idle time between the (start, end, kernel name) microsecond `intervals` of device work,
    per step of `steps` (overlapping intervals merge first). The host's time between consecutive
    steps is among the long gaps: `steps - 1` of them, divided by `steps`; none with one step. In
    eager steps the short gaps can be the host's too. A long gap inside a step is the host
    falling behind the device: a sync, or host work between two launches that outlasts the
    kernels queued before it; its site names where."""
    short = long = 0.0
    n_short = n_long = 0
    sites: dict[tuple[str, str], list[float]] = defaultdict(lambda: [0, 0.0])
    busy_until = None
    last = ""
    for start, end, name in sorted(intervals):
        if busy_until is not None and start > busy_until:
            gap = start - busy_until
            if gap <= GAP_SPLIT_US:
                short, n_short = short + gap, n_short + 1
            else:
                long, n_long = long + gap, n_long + 1
                site = sites[(last, name)]
                site[0] += 1
                site[1] += gap
        if busy_until is None or end >= busy_until:
            busy_until, last = end, name
    ranked = sorted(sites.items(), key=lambda item: item[1][1], reverse=True)[:top_sites]
    return DeviceGaps(
        short / steps, n_short / steps, long / steps, n_long / steps,
        tuple(GapSite(b, a, n / steps, us / steps) for (b, a), (n, us) in ranked),
    )  # fmt: skip


def critical_path_us(intervals: list[tuple[float, float, str]]) -> list[tuple[str, float]]:
    """(kernel name, microseconds) of each (start, end, name) interval of device work: the part
    of it past the end of everything that started before it, so the times add up to the device's
    busy time. On one stream without overlap that is each kernel's duration. Kernels launched
    with programmatic dependent launch (vllm/triton_utils/pdl.py) start before the kernel ahead
    of them ends and wait: their full durations would count that wait twice."""
    out = []
    busy_until = None
    for start, end, name in sorted(intervals):
        begin = start if busy_until is None else max(start, busy_until)
        out.append((name, max(0.0, end - begin)))
        busy_until = end if busy_until is None else max(busy_until, end)
    return out


def profile_steps(step: Callable[[], Any], steps: int, device: torch.device) -> list[KernelTime]:
    """Run `step` `steps` times under the profiler; per kernel name, device microseconds and
    launches per step, longest first."""
    return profile_steps_and_gaps(step, steps, device)[0]


def profile_steps_and_gaps(
    step: Callable[[], Any], steps: int, device: torch.device
) -> tuple[list[KernelTime], DeviceGaps | None]:
    """`profile_steps`, and on a GPU the device's idle time between the kernels (None on the
    CPU, where operators nest and overlap)."""
    if steps < 1:
        raise ValueError(f"steps must be >= 1, got {steps}")
    cuda = device.type == "cuda"
    activity = ProfilerActivity.CUDA if cuda else ProfilerActivity.CPU
    with profile(activities=[activity]) as prof:
        for _ in range(steps):
            step()
        if cuda:
            torch.cuda.synchronize(device)
    totals: dict[str, float] = defaultdict(float)
    counts: dict[str, int] = defaultdict(int)
    intervals = []
    for event in prof.events():
        if cuda:
            if event.device_type == DeviceType.CUDA:
                intervals.append((event.time_range.start, event.time_range.end, event.name))
            continue
        # CPU operators nest; self time counts each microsecond once.
        if event.device_type != DeviceType.CPU or not event.name.startswith("aten::"):
            continue
        totals[event.name] += event.self_cpu_time_total
        counts[event.name] += 1
    for name, us in critical_path_us(intervals):
        totals[name] += us
        counts[name] += 1
    kernels = [
        KernelTime(name, group_of(name), us / steps, counts[name] / steps)
        for name, us in totals.items()
    ]
    kernels.sort(key=lambda k: k.us_per_step, reverse=True)
    return kernels, device_gaps(intervals, steps) if cuda else None


def breakdown(
    kernels: list[KernelTime],
    step_us: float,
    floor_bytes: dict[str, float],
    copy_gbps: float,
    floor_flops: dict[str, float] | None = None,
    peak_tflops: float | None = None,
) -> list[dict[str, Any]]:
    """One row per group, longest first: us per step, % of `step_us`, and where `floor_bytes`
    names the group, its floor (bytes at `copy_gbps`) as a % of its time. With `floor_flops` (bf16
    matmul FLOPs per step, at `peak_tflops`) the floor of a group named there is the larger of the
    two, and the row says which one (`bound`)."""
    if floor_flops and not peak_tflops:
        raise ValueError("floor_flops needs peak_tflops")
    per_group: dict[str, float] = defaultdict(float)
    for k in kernels:
        per_group[k.group] += k.us_per_step
    rows = []
    for group, us in sorted(per_group.items(), key=lambda item: item[1], reverse=True):
        row: dict[str, Any] = {"group": group, "us_per_step": us,
                               "pct_of_step": 100 * us / step_us}  # fmt: skip
        floors = {}
        if group in floor_bytes:
            floors["bytes"] = floor_bytes[group] / (copy_gbps * 1e3)
        if floor_flops and group in floor_flops:
            floors["FLOPs"] = floor_flops[group] / (peak_tflops * 1e6)
        if floors and us > 0:
            bound, floor_us = max(floors.items(), key=lambda item: item[1])
            row["floor_us"] = floor_us
            row["pct_of_floor"] = 100 * floor_us / us
            if floor_flops is not None:
                row["bound"] = bound
        rows.append(row)
    return rows
