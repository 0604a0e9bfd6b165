"""Benchmark the small-M Triton GEMV (vllm/model_executor/kernels/linear/gemv.py) against the
vendor GEMMs it replaces, on Kimi-Linear's dense-linear shapes.

  bf16   gemv(x, w)                      vs  F.linear(x, w)             (cuBLAS)
  fp8    gemv_fp8(a, a_scale, w, w_scale) vs  torch._scaled_mm rowwise   (PTPC: [M, 1], [1, N])

Shapes (K -> N): o_proj 4096 -> 2304, 2304 -> 12448, shared expert 2304 -> 1024 and 1024 -> 2304,
LM head 2304 -> 163840 (bf16 only: the LM head stays bf16). M in 1, 2, 4, 8, 16, 32, 64.

Timing: CUDA-graph replay of one call per weight copy over --copies rotating copies of the weight
(>= 16 by default, so that consecutive calls never find their weight in the H200's 50 MB L2),
microseconds per call. Bandwidth counts the weight bytes only (N * K * element size) against an
eager `copy_` of --copy-gib GiB measured in the same run after a warm-up (read + write bytes over
time), reported as % of copy.

The last lines suggest BF16_GEMV_MAX_M / FP8_GEMV_MAX_M (gemv.py): the largest measured M up to
which the fastest GEMV config beats the vendor GEMM at every shape and every smaller M.

    python benchmarks/kernels/benchmark_gemv.py --output-json gemv.json --csv gemv.csv
    python benchmarks/kernels/benchmark_gemv.py --dtypes fp8 --shapes o_proj --m 1 4 16 \\
        --configs default 4,1024,4 4,1024,4,1,1 8,512,4 8,1024,8 4,512,4,2 16,256,4,1,3,dot \
        64,128,4,1,3,dot
    python benchmarks/kernels/benchmark_gemv.py --dry-run       # tiny shapes on the CPU

A config is `BLOCK_N,BLOCK_K,WARPS[,SPLIT_K[,STAGES[,dot]]][,mBLOCK_M]` (gemv.GemvConfig:
output channels per program, K chunk per step, warps, K splits (default 1), software-pipeline
stages (default 3), tl.dot instead of multiply-and-sum, rows per program), or `default` for
gemv.default_config.
"""

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F
from benchmark_rmsnorm_gated_fp8_per_token import copy_gbps, time_graph, write_csv

from vllm.model_executor.kernels.linear import gemv as gemv_op
from vllm.model_executor.kernels.linear.gemv import GemvConfig, gemv, gemv_fp8
from vllm.model_executor.kernels.linear.scaled_mm.pytorch import dequantized_matmul
from vllm.platforms import current_platform

SHAPES = {  # name -> (K, N)
    "o_proj": (4096, 2304),
    "qkv": (2304, 12448),
    "shared_down": (1024, 2304),
    "shared_up": (2304, 1024),
    "lm_head": (2304, 163840),
}
FP8_SHAPES = ("o_proj", "qkv", "shared_down", "shared_up")
M_VALUES = [1, 2, 4, 8, 16, 32, 64]
DRY_RUN_SHAPES = {"tiny": (64, 48)}


def gemv_config(text: str) -> tuple[str, GemvConfig | None]:
    """`BLOCK_N,BLOCK_K,WARPS[,SPLIT_K[,STAGES[,dot]]][,mBLOCK_M]` or `default` -> (label,
    config)."""
    if text == "default":
        return text, None
    parts = text.split(",")
    block_m = None
    if parts[-1].startswith("m") and parts[-1][1:].isdigit():
        block_m = int(parts.pop()[1:])
    use_dot = parts[-1] == "dot"
    if use_dot:
        parts = parts[:-1]
    try:
        values = [int(p) for p in parts]
        if not 3 <= len(values) <= 5:
            raise ValueError
        names = ("block_n", "block_k", "num_warps", "split_k", "num_stages")
        config = GemvConfig(
            **dict(zip(names, values, strict=False)), use_dot=use_dot, block_m=block_m
        )
        config.check()
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not BLOCK_N,BLOCK_K,WARPS[,SPLIT_K[,STAGES[,dot]]][,mBLOCK_M] (powers "
            "of two; tl.dot needs BLOCK_N, BLOCK_K, BLOCK_M >= 16) or 'default'"
        ) from None
    return text, config


def time_eager(fn: Callable[[], object], reps: int = 5) -> float:
    """Median microseconds of an eager call on the CPU (dry runs: checks the script only)."""
    fn()
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1e6)
    return statistics.median(times)


def make_weights(k: int, n: int, dtype: str, copies: int, device: torch.device, seed: int):
    """`copies` weights (bf16, or FP8 codes with [N, 1] scales) and one input of M = 64 rows;
    benchmarks slice the first M rows."""
    gen = torch.Generator(device=device).manual_seed(seed)
    base = torch.randn(n, k, generator=gen, device=device) * k**-0.5
    x = torch.randn(max(M_VALUES), k, generator=gen, device=device)
    if dtype == "bf16":
        w = base.to(torch.bfloat16)
        return x.to(torch.bfloat16), None, [w.clone() for _ in range(copies)], None
    fp8 = current_platform.fp8_dtype()
    fp8_max = current_platform.fp8_max()
    w_scale = base.abs().amax(dim=1, keepdim=True) / fp8_max
    codes = (base / w_scale).to(fp8)
    x_scale = x.abs().amax(dim=1, keepdim=True) / fp8_max
    del base
    return (x / x_scale).to(fp8), x_scale, [codes.clone() for _ in range(copies)], w_scale


def calls_for(dtype: str, path: str, config: GemvConfig | None, x, x_scale, weights, w_scale):
    """One callable per weight copy: the op to time, on that copy."""
    out_dtype = torch.bfloat16
    if dtype == "bf16" and path == "vendor":
        return [lambda w=w: F.linear(x, w) for w in weights]
    if dtype == "bf16":
        return [lambda w=w: gemv(x, w, config=config) for w in weights]
    if path == "gemv":
        return [lambda w=w: gemv_fp8(x, x_scale, w, w_scale, config=config) for w in weights]
    if x.is_cuda:
        # The rowwise kernel's vendor path: [K, N] column-major view, [M, 1] and [1, N] scales.
        return [
            lambda w=w: torch._scaled_mm(
                x, w.t(), scale_a=x_scale, scale_b=w_scale.t(), out_dtype=out_dtype
            )
            for w in weights
        ]
    return [lambda w=w: dequantized_matmul(x, w.t(), out_dtype, x_scale, w_scale, None)
            for w in weights]  # fmt: skip


def suggest_max_m(rows: list[dict[str, object]], dtype: str) -> int | None:
    """Largest M such that, at every shape, the fastest GEMV config beats the vendor GEMM at it
    and at every smaller measured M; None without both paths measured (0: never)."""
    best: dict[tuple[str, int], dict[str, float]] = {}
    for row in rows:
        if row["dtype"] != dtype:
            continue
        path = "vendor" if row["path"] == "vendor" else "gemv"
        by_path = best.setdefault((str(row["shape"]), int(row["m"])), {})
        by_path[path] = min(by_path.get(path, float("inf")), float(row["us"]))
    ms = sorted({m for (_, m), p in best.items() if len(p) == 2})
    if not ms:
        return None
    limit = 0
    for m in ms:
        at_m = [p for (_, mm), p in best.items() if mm == m and len(p) == 2]
        if any(p["gemv"] >= p["vendor"] for p in at_m):
            break
        limit = m
    return limit


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--shapes", nargs="+", choices=list(SHAPES), default=list(SHAPES))
    parser.add_argument("--dtypes", nargs="+", choices=["bf16", "fp8"], default=["bf16", "fp8"])
    parser.add_argument("--m", type=int, nargs="+", default=M_VALUES, help="rows (tokens)")
    parser.add_argument(
        "--configs",
        nargs="+",
        type=gemv_config,
        default=[("default", None)],
        metavar="BN,BK,W[,S[,ST[,dot]]]",
        help="GEMV configs to time (a sweep); default: gemv.default_config only",
    )
    parser.add_argument("--copies", type=int, default=16, help="rotating weight copies (>= 16)")
    parser.add_argument("--copy-gib", type=float, default=2.0, help="size of the copy baseline")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--csv", help="write the rows to this CSV file (after each row)")
    parser.add_argument(
        "--output-json", "--out", dest="output_json",
        help="write the environment, copy bandwidth and rows to this JSON file",
    )  # fmt: skip
    parser.add_argument(
        "--dry-run",
        action="store_true",
        help="a tiny shape on the CPU, eager timing: checks the script, measures nothing useful",
    )
    args = parser.parse_args(argv)
    if args.dry_run:
        device, shapes, copies, gib = torch.device("cpu"), DRY_RUN_SHAPES, 2, 1 / 64
    elif torch.cuda.is_available():
        device, copies, gib = torch.device("cuda"), args.copies, args.copy_gib
        shapes = {name: SHAPES[name] for name in args.shapes}
        if copies < 16:
            parser.error(f"--copies must be at least 16 (L2 residency), got {copies}")
        if gib < 1:
            parser.error(f"--copy-gib must be at least 1 (smaller copies hit L2), got {gib}")
    else:
        parser.error("this benchmark needs a CUDA GPU (or --dry-run)")
    if any(m < 1 or m > max(M_VALUES) for m in args.m):
        parser.error(f"--m values must be in 1..{max(M_VALUES)}")

    if device.type == "cuda":
        copy = copy_gbps(gib)
    else:
        src = torch.empty(int(gib * 2**30), dtype=torch.uint8)
        copy = 2 * src.numel() / (time_eager(lambda: src.clone()) * 1e-6) / 1e9
    print(f"{device.type}: eager copy_ of {gib:g} GiB: {copy:.0f} GB/s", flush=True)
    record = {
        "device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu",
        "torch": torch.__version__,
        "copy_gib": gib,
        "copy_gbps": round(copy, 1),
        "copies": copies,
        "rows": [],
    }
    rows = record["rows"]
    paths = [("vendor", None, "vendor")] + [("gemv", cfg, label) for label, cfg in args.configs]
    with torch.inference_mode():
        for dtype in args.dtypes:
            for name, (k, n) in shapes.items():
                if dtype == "fp8" and name not in FP8_SHAPES and not args.dry_run:
                    continue
                x_all, xs_all, weights, w_scale = make_weights(
                    k, n, dtype, copies, device, args.seed
                )
                weight_bytes = n * k * weights[0].element_size()
                for m in args.m:
                    x = x_all[:m]
                    x_scale = xs_all[:m].contiguous() if xs_all is not None else None
                    for path, config, label in paths:
                        calls = calls_for(dtype, path, config, x, x_scale, weights, w_scale)

                        def run_all(calls=calls):
                            for call in calls:
                                call()

                        if device.type == "cuda":
                            us = time_graph(run_all, 1) / len(calls)
                        else:
                            us = time_eager(run_all) / len(calls)
                        gbps = weight_bytes / (us * 1e-6) / 1e9
                        row = dict(dtype=dtype, shape=name, k=k, n=n, m=m, path=path,
                                   config=label, us=round(us, 2), gbps=round(gbps, 1),
                                   pct_copy=round(100 * gbps / copy, 1),
                                   weight_mb=round(weight_bytes / 1e6, 2))  # fmt: skip
                        rows.append(row)
                        write_csv(args.csv, rows)
                        print(
                            f"{dtype:>4} {name:>11} M={m:>3} {label:>22} {us:9.2f} us "
                            f"{gbps:7.0f} GB/s {row['pct_copy']:5.1f}% of copy",
                            flush=True,
                        )
                del weights
                if device.type == "cuda":
                    torch.cuda.empty_cache()
    constants = {"bf16": "BF16_GEMV_MAX_M", "fp8": "FP8_GEMV_MAX_M"}
    for dtype in args.dtypes:
        limit = suggest_max_m(rows, dtype)
        if limit is not None:
            current = getattr(gemv_op, constants[dtype])
            record[constants[dtype]] = limit
            print(
                f"{dtype}: the GEMV beats the vendor GEMM at every shape up to M = {limit}: "
                f"{constants[dtype]} = {limit} (now {current})"
            )
    if args.output_json:
        with open(args.output_json, "w") as f:
            json.dump(record, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
