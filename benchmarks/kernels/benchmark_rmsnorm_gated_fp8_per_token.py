"""Benchmark the fused gated RMSNorm + per-token FP8 op against its baselines and ceilings.

Providers, timed in one run on the same inputs:
  fused          rmsnorm_gated_fp8_per_token (this fork)
  ref_design     a plain reimplementation of the upstream kernel design (upstream-facts F.3): one
                 token per program, a [next_pow2(H), next_pow2(D)] tile, default num_warps
  unfused        fla-core's FusedRMSNormGated (sigmoid), then per_token_fp8_quant
  unfused_native fla-core's FusedRMSNormGated, then vllm._C's per-token quant (if built)
  copy           a same-bytes Triton copy: reads x and gate, writes FP8 and a per-token scale
                 (the best of several block sizes): the bandwidth ceiling
  empty          an empty Triton kernel: the launch floor

Small T (<= --graph-max-tokens) is timed as CUDA-graph replay of --graph-calls back-to-back calls,
which is what a decode step pays; larger T as replays of a one-call CUDA graph with L2 flushed
(a 256 MiB buffer zeroed) before each, timed with CUDA events.
Reports microseconds per call, GB/s (x + gate read, FP8 + scale written) and percent of the copy.

    python benchmarks/kernels/benchmark_rmsnorm_gated_fp8_per_token.py --csv out.csv

Every run first prints the host time per eager call at T=1 and where it goes (pre-launch Python,
launch, Triton's plain dispatch of the same kernel; see host_overhead); --host-overhead prints
only that, in well under a minute.
"""

import argparse
import itertools
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from unittest import mock

import torch
import triton
import triton.language as tl
from kernel_bench import require_gpu, time_flushed, time_graph, write_csv

import vllm.models.kimi_k3.amd.ops.rmsnorm_gated_fp8_per_token as op_module
from vllm import _custom_ops
from vllm.models.kimi_k3.amd.ops.rmsnorm_gated_fp8_per_token import (
    HEAD_SPLITS,
    FusedLaunchConfig,
    fused_launch_config,
    fused_launch_spec,
    head_chunks,
    launch_fused,
    per_token_fp8_quant,
    rmsnorm_gated_fp8_per_token,
)
from vllm.platforms import current_platform
from vllm.triton_utils.launch import launch
from vllm.triton_utils.pdl import use_pdl
from vllm.utils.cli import nonnegative_int, output_file, positive_float, positive_int, run_main

TOKENS = [1, 4, 16, 64, 256, 1024, 4096, 16384, 65536]
HEADS = [8, 12, 32]


# ---------------------------------------------------------------------------------------------
# Comparison kernels (benchmark-only)
# ---------------------------------------------------------------------------------------------


@triton.jit
def _reference_design_kernel(
    x_ptr, g_ptr, w_ptr, q_ptr, s_ptr,
    stride_xt, stride_xh, stride_gt, stride_gh, stride_qt,
    eps, fp8_max,
    HEADS: tl.constexpr, HEADS_POW2: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK: tl.constexpr,
):  # fmt: skip
    tok = tl.program_id(0)
    head = tl.arange(0, HEADS_POW2)[:, None]
    col = tl.arange(0, BLOCK)[None, :]
    mask = (head < HEADS) & (col < HEAD_DIM)
    h_safe = tl.where(head < HEADS, head, 0)
    x = tl.load(x_ptr + tok * stride_xt + h_safe * stride_xh + col, mask=mask, other=0.0)
    g = tl.load(g_ptr + tok * stride_gt + h_safe * stride_gh + col, mask=mask, other=0.0)
    w = tl.load(w_ptr + col, mask=col < HEAD_DIM, other=0.0).to(tl.float32)
    x = x.to(tl.float32)
    var = tl.sum(x * x, axis=1) / HEAD_DIM
    rstd = 1.0 / tl.sqrt(var + eps)
    normed = x * rstd[:, None] * w * tl.sigmoid(g.to(tl.float32))
    scale = tl.max(tl.abs(normed)) / fp8_max
    inv = tl.where(scale > 0, 1.0 / scale, 0.0)
    q = tl.clamp(normed * inv, -fp8_max, fp8_max)
    tl.store(q_ptr + tok * stride_qt + h_safe * HEAD_DIM + col, q.to(q_ptr.dtype.element_ty), mask)
    tl.store(s_ptr + tok, scale)


@triton.jit
def _same_bytes_copy_kernel(
    x_ptr, g_ptr, q_ptr, s_ptr, n_rows,
    stride_xt, stride_xh, stride_gt, stride_gh,
    HEADS: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_ROWS: tl.constexpr,
):  # fmt: skip
    # Rows are (token, head) pairs, read with the same strides as the fused op.
    rows = tl.program_id(0) * BLOCK_ROWS + tl.arange(0, BLOCK_ROWS)
    ok = rows < n_rows
    rows = tl.where(ok, rows, 0)
    tok = rows // HEADS
    head = rows % HEADS
    cols = tl.arange(0, HEAD_DIM)
    x = tl.load(x_ptr + (tok * stride_xt + head * stride_xh)[:, None] + cols[None, :],
                mask=ok[:, None], other=0.0)  # fmt: skip
    g = tl.load(g_ptr + (tok * stride_gt + head * stride_gh)[:, None] + cols[None, :],
                mask=ok[:, None], other=0.0)  # fmt: skip
    v = x.to(tl.float32) + g.to(tl.float32)
    q_offs = (tok * (HEADS * HEAD_DIM) + head * HEAD_DIM)[:, None] + cols[None, :]
    tl.store(q_ptr + q_offs, v.to(q_ptr.dtype.element_ty), mask=ok[:, None])
    tl.store(s_ptr + tok, tl.sum(v, axis=1), mask=ok & (head == 0))


@triton.jit
def _empty_kernel(x_ptr):
    pass


# ---------------------------------------------------------------------------------------------
# Cases
# ---------------------------------------------------------------------------------------------


@dataclass
class Case:
    tokens: int
    heads: int
    head_dim: int
    strided_gate: bool
    x: torch.Tensor
    gate: torch.Tensor
    weight: torch.Tensor
    eps: float

    @property
    def name(self) -> str:
        return f"H={self.heads}" + (" strided-gate" if self.strided_gate else "")

    @property
    def bytes_moved(self) -> int:
        n = self.tokens * self.heads * self.head_dim
        return n * (self.x.element_size() + self.gate.element_size() + 1) + 4 * self.tokens


def make_case(tokens: int, heads: int, head_dim: int, strided_gate: bool, eps: float) -> Case:
    width = heads * head_dim
    x = torch.randn(tokens, heads, head_dim, dtype=torch.bfloat16, device="cuda")
    if strided_gate:
        # KDA's fused in_proj output: q, k, v, g, f_a, b, padded to a multiple of 16 (E.3).
        row = 4 * width + head_dim + heads
        row += -row % 16
        proj = torch.randn(tokens, row, dtype=torch.bfloat16, device="cuda")
        gate = proj[:, 3 * width : 4 * width].view(tokens, heads, head_dim)
    else:
        gate = torch.randn(tokens, heads, head_dim, dtype=torch.bfloat16, device="cuda")
    weight = torch.rand(head_dim, dtype=torch.bfloat16, device="cuda") + 0.5
    return Case(tokens, heads, head_dim, strided_gate, x, gate, weight, eps)


def providers(case: Case, fla_norm: torch.nn.Module | None) -> dict[str, Callable[[], object]]:
    t, h, d = case.tokens, case.heads, case.head_dim
    fp8 = current_platform.fp8_dtype()
    fp8_max = current_platform.fp8_max()
    x, gate, weight, eps = case.x, case.gate, case.weight, case.eps
    q = torch.empty(t, h * d, dtype=fp8, device="cuda")
    s = torch.empty(t, 1, dtype=torch.float32, device="cuda")
    fns: dict[str, Callable[[], object]] = {
        "fused": lambda: rmsnorm_gated_fp8_per_token(x, weight, gate, eps, out=q, scale_out=s),
        "ref_design": lambda: _reference_design_kernel[(t,)](
            x,
            gate,
            weight,
            q,
            s,
            x.stride(0),
            x.stride(1),
            gate.stride(0),
            gate.stride(1),
            q.stride(0),
            eps,
            fp8_max,
            HEADS=h,
            HEADS_POW2=triton.next_power_of_2(h),
            HEAD_DIM=d,
            BLOCK=triton.next_power_of_2(d),
        ),  # fmt: skip
    }
    if fla_norm is not None:
        fns["unfused"] = lambda: per_token_fp8_quant(
            fla_norm(x, gate).view(t, h * d), out=q, scale_out=s
        )
        if _custom_ops.has_native_ops():
            fns["unfused_native"] = lambda: _custom_ops.dynamic_per_token_scaled_fp8_quant(
                fla_norm(x, gate).view(t, h * d)
            )
    for rows, warps in ((8, 2), (16, 4), (16, 8), (64, 4), (64, 8)):
        fns[f"copy/{rows}/{warps}"] = lambda rows=rows, warps=warps: _same_bytes_copy_kernel[
            (triton.cdiv(t * h, rows),)
        ](
            x, gate, q, s, t * h,
            x.stride(0), x.stride(1), gate.stride(0), gate.stride(1),
            HEADS=h, HEAD_DIM=d, BLOCK_ROWS=rows, num_warps=warps,
        )  # fmt: skip
    fns["empty"] = lambda: _empty_kernel[(1,)](x)
    return fns


def run_case(case: Case, fla_norm, args) -> dict[str, float]:
    timer = (
        (lambda fn: time_graph(fn, args.graph_calls))
        if case.tokens <= args.graph_max_tokens
        else time_flushed
    )
    results = {}
    for name, fn in providers(case, fla_norm).items():
        fn()
        torch.cuda.synchronize()
        results[name] = timer(fn)
    copies = {k: v for k, v in results.items() if k.startswith("copy/")}
    results = {k: v for k, v in results.items() if not k.startswith("copy/")}
    results["copy"] = min(copies.values())
    return results


def sweep_configs(case: Case, args) -> list[tuple[FusedLaunchConfig, float]]:
    """Time every sensible launch configuration of the fused kernel for one case."""
    t, h, d = case.tokens, case.heads, case.head_dim
    fp8 = current_platform.fp8_dtype()
    q = torch.empty(t, h * d, dtype=fp8, device="cuda")
    s = torch.empty(t, 1, dtype=torch.float32, device="cuda")
    fp8_max, min_scale = current_platform.fp8_max(), current_platform.fp8_min_scale()
    timer = (
        (lambda fn: time_graph(fn, args.graph_calls))
        if t <= args.graph_max_tokens
        else time_flushed
    )
    default = fused_launch_config(triton.next_power_of_2(t), h, d)
    if default.wide:
        configs = [default._replace(num_warps=w) for w in (1, 2, 4, 8, 16)]
    else:
        configs = [
            FusedLaunchConfig(False, h, w, split, tile)
            for w, split, tile in itertools.product((1, 2, 4, 8, 16), HEAD_SPLITS, (True, False))
            if split == "pow2" or head_chunks(h, split) != head_chunks(h)
        ]
    out = []
    for config in configs:

        def fn(config=config):
            launch_fused(case.x, case.weight, case.gate, case.eps, q, s, fp8_max, min_scale, config)

        fn()
        torch.cuda.synchronize()
        out.append((config, timer(fn)))
    return out


HOST_REPEATS, HOST_CALLS = 7, 200


def _host_times(fn: Callable[[], object]) -> list[float]:
    """Host microseconds per call of HOST_CALLS eager calls, HOST_REPEATS times."""
    for _ in range(50):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(HOST_REPEATS):
        start = time.perf_counter()
        for _ in range(HOST_CALLS):
            fn()
        times.append((time.perf_counter() - start) / HOST_CALLS * 1e6)
        torch.cuda.synchronize()
    return times


def _host_us(fn: Callable[[], object]) -> float:
    """Median of `_host_times`."""
    return statistics.median(_host_times(fn))


def host_overhead(args) -> dict[str, float]:
    """Eager host microseconds per call at T=1, H=12, strided gate (the GPU idles: host-bound),
    what an eager step pays per KDA layer, and where it goes:

      fused          the op with preallocated outputs (the `fused` provider); fused_best the
                     fastest of its repeats
      pre_launch     the same with the op's `launch` a no-op: its checks, launch choices and
                     arguments
      launch         vllm.triton_utils.launch of that kernel on those arguments
      kernel_grid    the same kernel through Triton's `kernel[grid](...)` on every call
      fused_alloc    the op allocating its outputs, as the KDA layer calls it
      quant          per_token_fp8_quant of the [1, H * D] row into preallocated outputs
      ref_design     the upstream design's bare `kernel[grid](...)`
      empty          an empty kernel's `kernel[grid](x)`: Triton's launch floor
    """
    case = make_case(1, 12, args.head_dim, True, args.eps)
    fns = providers(case, None)
    x, gate, weight, eps = case.x, case.gate, case.weight, case.eps
    width = case.heads * case.head_dim
    q = torch.empty(1, width, dtype=current_platform.fp8_dtype(), device="cuda")
    s = torch.empty(1, 1, dtype=torch.float32, device="cuda")
    fp8_max, min_scale = current_platform.fp8_max(), current_platform.fp8_min_scale()
    config = fused_launch_config(1, case.heads, case.head_dim)
    spec = fused_launch_spec(config, case.heads, case.head_dim, use_pdl(x.device))
    wide, narrow = op_module._rmsnorm_gated_fp8_wide_kernel, op_module._rmsnorm_gated_fp8_kernel
    kernel = wide if config.wide else narrow
    kernel_args = (
        x, gate, weight, q, s, x.stride(0), x.stride(1), gate.stride(0), gate.stride(1),
        q.stride(0), s.stride(0), eps, fp8_max, min_scale,
    )  # fmt: skip
    row = x.reshape(1, width)
    fused = _host_times(fns["fused"])
    out = {"fused": statistics.median(fused), "fused_best": min(fused)}
    with mock.patch.object(op_module, "launch", lambda *a: None):
        out["pre_launch"] = _host_us(fns["fused"])
    out["launch"] = _host_us(lambda: launch(kernel, (1, 1, 1), kernel_args, spec))
    out["kernel_grid"] = _host_us(lambda: kernel[(1, 1, 1)](*kernel_args, **spec.kwargs))
    out["fused_alloc"] = _host_us(lambda: rmsnorm_gated_fp8_per_token(x, weight, gate, eps))
    out["quant"] = _host_us(lambda: per_token_fp8_quant(row, out=q, scale_out=s))
    out["ref_design"] = _host_us(fns["ref_design"])
    out["empty"] = _host_us(fns["empty"])
    return out


def print_host_overhead(host: dict[str, float]) -> None:
    lines = [
        f"host us/call (eager, T=1, H=12, strided gate; median of {HOST_REPEATS} x {HOST_CALLS} "
        "calls):",
        f"  fused {host['fused']:.1f} (best {host['fused_best']:.1f}) ~ pre-launch "
        f"{host['pre_launch']:.1f} + launch "
        f"{host['launch']:.1f} (that kernel through kernel[grid]: {host['kernel_grid']:.1f})",
        f"  fused allocating its outputs, as the KDA layer calls it: {host['fused_alloc']:.1f}",
        f"  per_token_fp8_quant {host['quant']:.1f}, ref_design {host['ref_design']:.1f}, "
        f"empty kernel {host['empty']:.1f}",
    ]
    print("\n".join("# " + line for line in lines), flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--tokens", type=positive_int, nargs="+", default=TOKENS, help="T values")
    parser.add_argument("--heads", type=positive_int, nargs="+", default=HEADS, help="H values")
    parser.add_argument("--head-dim", type=positive_int, default=128, help="D (default 128)")
    parser.add_argument(
        "--eps", type=positive_float, default=1e-5, help="RMSNorm epsilon (default 1e-5)"
    )
    parser.add_argument(
        "--strided-gate-heads",
        type=nonnegative_int,
        default=12,
        help="H of the extra strided-gate case (gate sliced from a fused projection); 0: none",
    )
    parser.add_argument(
        "--graph-max-tokens", type=nonnegative_int, default=1024,
        help="T up to which calls are timed in a CUDA graph; larger T: L2 flushed before each "
        "call (default 1024)",
    )  # fmt: skip
    parser.add_argument(
        "--graph-calls", type=positive_int, default=20, help="calls per captured graph"
    )
    parser.add_argument("--no-fla", action="store_true", help="skip the fla-core baselines")
    parser.add_argument(
        "--sweep", action="store_true", help="time every fused launch config instead"
    )
    parser.add_argument(
        "--host-overhead",
        action="store_true",
        help="only the host time per eager call and its breakdown (well under a minute)",
    )
    parser.add_argument("--csv", type=output_file, help="write the results to this CSV file")
    args = parser.parse_args(argv)
    require_gpu(parser, gpu="CUDA or ROCm GPU", dry_run=False)
    if args.head_dim & (args.head_dim - 1) or args.head_dim > 512:
        parser.error("--head-dim must be a power of two up to 512 (the copy and reference tiles)")

    print(
        f"# {torch.cuda.get_device_name(0)}, torch {torch.__version__}, triton {triton.__version__}"
    )
    if args.host_overhead:
        host = host_overhead(args)
        print_host_overhead(host)
        write_csv(args.csv, [{k: round(v, 2) for k, v in host.items()}])
        return 0

    fla_norm = None
    if not args.no_fla:
        from fla.modules import FusedRMSNormGated

        fla_norm = FusedRMSNormGated(args.head_dim, eps=args.eps, activation="sigmoid")
        fla_norm = fla_norm.to(device="cuda", dtype=torch.bfloat16)

    if not args.sweep:
        print_host_overhead(host_overhead(args))
    cases = [(t, h, False) for h in args.heads for t in args.tokens]
    if args.strided_gate_heads:
        cases += [(t, args.strided_gate_heads, True) for t in args.tokens]

    rows: list[dict[str, object]] = []
    torch.manual_seed(0)
    with torch.inference_mode():
        for t, h, strided in cases:
            case = make_case(t, h, args.head_dim, strided, args.eps)
            if fla_norm is not None:
                fla_norm.weight.copy_(case.weight)
            if args.sweep:
                default = fused_launch_config(triton.next_power_of_2(t), h, args.head_dim)
                for config, us in sweep_configs(case, args):
                    rows.append(
                        dict(case=case.name, T=t, warps=config.num_warps, split=config.head_split,
                             weight_tile=config.weight_tile,
                             us=round(us, 3), default=config == default)
                    )  # fmt: skip
                best = min((r for r in rows if r["case"] == case.name and r["T"] == t),
                           key=lambda r: r["us"])  # fmt: skip
                print(f"{case.name:>18} T={t:>6} best warps={best['warps']} split={best['split']} "
                      f"weight_tile={best['weight_tile']} "
                      f"{best['us']:.2f} us", flush=True)  # fmt: skip
                write_csv(args.csv, rows)
                continue
            res = run_case(case, fla_norm, args)
            gbs = {k: case.bytes_moved / (v * 1e-6) / 1e9 for k, v in res.items()}
            row = dict(
                case=case.name, T=t, timing="graph" if t <= args.graph_max_tokens else "flushed"
            )
            for k, v in res.items():
                row[f"{k}_us"] = round(v, 3)
            row["fused_GBps"] = round(gbs["fused"], 1)
            row["fused_pct_copy"] = round(100 * res["copy"] / res["fused"], 1)
            row["ref_design_pct_copy"] = round(100 * res["copy"] / res["ref_design"], 1)
            row["fused_vs_copy"] = round(res["fused"] / res["copy"], 3)
            row["speedup_vs_ref_design"] = round(res["ref_design"] / res["fused"], 3)
            if "unfused" in res:
                best_unfused = min(v for k, v in res.items() if k.startswith("unfused"))
                row["speedup_vs_unfused"] = round(best_unfused / res["fused"], 3)
            rows.append(row)
            print(
                f"{case.name:>18} T={t:>6} fused {res['fused']:8.2f} us "
                f"({row['fused_pct_copy']:5.1f}% of copy {res['copy']:.2f}) "
                f"ref_design {res['ref_design']:8.2f} "
                + (f"unfused {res['unfused']:8.2f} " if "unfused" in res else "")
                + (f"native {res['unfused_native']:8.2f} " if "unfused_native" in res else "")
                + f"empty {res['empty']:.2f}",
                flush=True,
            )
            write_csv(args.csv, rows)
    return 0


if __name__ == "__main__":
    sys.exit(run_main(main))
