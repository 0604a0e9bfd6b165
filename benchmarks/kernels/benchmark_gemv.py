"""Benchmark the small-M Triton GEMV (vllm/model_executor/kernels/linear/gemv.py) against the
vendor GEMMs it replaces, on Kimi-Linear's dense-linear shapes.

  bf16   gemv(x, w)                      vs  F.linear(x, w)             (cuBLAS)
  fp8    gemv_fp8(a, a_scale, w, w_scale) vs  torch._scaled_mm rowwise   (PTPC: [M, 1], [1, N])

Shapes (K -> N) of Kimi-Linear-48B-A3B: o_proj 4096 -> 2304 (KDA and MLA), the KDA q/k/v-sized
2304 -> 12448, shared expert 2304 -> 1024 and 1024 -> 2304, MLA q_proj 2304 -> 6144 (32 heads x
192), kv_a_proj_with_mqa 2304 -> 576, the two merged as the model runs them (`fused_q_kv_a_proj`,
2304 -> 6720) and kv_b_proj 512 -> 8192 (bf16 only), the dense first layer's down projection
9216 -> 2304 (bf16 only), LM head 2304 -> 163840 (bf16 only: the LM head stays bf16). M in 1, 2,
4, 8, 16, 32, 64, 128, 256.

Timing: CUDA-graph replay of one call per weight copy over --copies rotating copies of the weight
(>= 16 by default, so that consecutive calls never find their weight in the H200's 50 MB L2),
microseconds per call. Bandwidth counts the weight bytes only (N * K * element size) against an
eager `copy_` of --copy-gib GiB measured in the same run after a warm-up (read + write bytes over
time), reported as % of copy.

A table per (dtype, shape, M) then names the fastest GEMV config and its time against the
vendor GEMM's. The last lines suggest BF16_GEMV_MAX_M / FP8_GEMV_MAX_M (gemv.py): the largest
measured M up to which the fastest multiply-and-sum config beats the vendor GEMM at every shape
the layers may send at that M (gemv_config.bf16_gemv_weight_fits / FP8_GEMV_MAX_WEIGHT_NUMEL
elements) and every smaller M; and BF16_DOT_MAX_M / FP8_DOT_MAX_M: from
there on, the same for the tl.dot configs.

    python benchmarks/kernels/benchmark_gemv.py --output-json gemv.json --csv gemv.csv
    python benchmarks/kernels/benchmark_gemv.py --dtypes fp8 --shapes o_proj --m 1 4 16 \\
        --configs default 4,1024,4 4,1024,4,1,1 8,512,4 8,1024,8 4,512,4,2 16,256,4,1,3,dot \
        64,128,4,1,3,dot
    python benchmarks/kernels/benchmark_gemv.py --dtypes fp8 --shapes o_proj \
        --m 8 16 32 64 128 256 --dot-sweep --csv dot_fp8.csv
    python benchmarks/kernels/benchmark_gemv.py --dry-run       # tiny shapes on the CPU

A config is `BLOCK_N,BLOCK_K,WARPS[,SPLIT_K[,STAGES[,dot|dot8]]][,mBLOCK_M]`
(gemv_config.GemvConfig: output channels per program, K chunk per step, warps, K splits (default 1;
`a`: gemv_config.auto_split_k), software-pipeline stages (default 3), tl.dot instead of
multiply-and-sum (`dot8`: with FP8 weights, the FP8 codes into the FP8 MMA; bf16 rows skip it), rows
per program), or `default` for gemv_config.default_config. --dot-sweep adds the tl.dot grid of
DOT_SWEEP. A config that does not fit the GPU (shared memory, registers) is reported and skipped.
"""

import argparse
import sys
from dataclasses import replace

import torch
import torch.nn.functional as F
from kernel_bench import (
    add_common_args,
    copy_gbps,
    note_dry_run_ignores,
    require_gpu,
    round_like_the_gpu_if_interpreting,
    time_eager,
    time_graph,
    write_csv,
)
from triton.runtime.errors import OutOfResources

from vllm.model_executor.kernels.linear import gemv_config as gemv_cfg
from vllm.model_executor.kernels.linear.gemv import gemv, gemv_fp8
from vllm.model_executor.kernels.linear.gemv_config import GemvConfig
from vllm.model_executor.kernels.linear.scaled_mm.pytorch import dequantized_matmul
from vllm.platforms import current_platform
from vllm.utils.cli import output_file, run_main, write_json

SHAPES = {  # name -> (K, N)
    "o_proj": (4096, 2304),
    "qkv": (2304, 12448),
    "shared_down": (1024, 2304),
    "shared_up": (2304, 1024),
    "mla_q": (2304, 6144),
    "mla_kv_a": (2304, 576),
    "mla_q_kv_a": (2304, 6720),
    "mla_kv_b": (512, 8192),
    "dense_down": (9216, 2304),
    "lm_head": (2304, 163840),
}
FP8_SHAPES = ("o_proj", "qkv", "shared_down", "shared_up")
M_VALUES = [1, 2, 4, 8, 16, 32, 64, 128, 256]
DRY_RUN_SHAPES = {"tiny": (64, 48)}
# --dot-sweep: the tl.dot ("swap AB") grid. BLOCK_N 64 / 128 (the MMA's 64-row side), BLOCK_K
# 128 / 256, 4 / 8 warps, 3..5 stages with the automatic split-K and rows per program; then, at
# the default's tile, split-K 1..8 against rows per program 16..64. FP8 rows also time each
# config with the FP8 MMA (dot8).
DOT_SWEEP = [
    f"{bn},{bk},{w},a,{st},dot" for bn in (64, 128) for bk in (128, 256) for w in (4, 8)
    for st in (3, 4, 5)
] + [f"128,128,4,{s},4,dot,m{bm}" for s in (1, 2, 4, 8) for bm in (16, 32, 64)]  # fmt: skip


def gemv_config(text: str) -> tuple[str, GemvConfig | None]:
    """`BLOCK_N,BLOCK_K,WARPS[,SPLIT_K[,STAGES[,dot|dot8|dot3]]][,mBLOCK_M]` or `default` ->
    (label, config); SPLIT_K `a`: gemv_config.auto_split_k (split_k None); dot8: FP8 MMA
    (`fp8_mma`), dot3: fp32 weights as three bf16 terms (`bf16x3`)."""
    if text == "default":
        return text, None
    parts = text.split(",")
    block_m = None
    if parts[-1].startswith("m") and parts[-1][1:].isdigit():
        block_m = int(parts.pop()[1:])
    use_dot = parts[-1] in ("dot", "dot8", "dot3")
    fp8_mma = parts[-1] == "dot8"
    bf16x3 = parts[-1] == "dot3"
    if use_dot:
        parts = parts[:-1]
    try:
        values = [None if i == 3 and p == "a" else int(p) for i, p in enumerate(parts)]
        if not 3 <= len(values) <= 5:
            raise ValueError
        names = ("block_n", "block_k", "num_warps", "split_k", "num_stages")
        config = GemvConfig(
            **dict(zip(names, values, strict=False)),
            use_dot=use_dot,
            block_m=block_m,
            fp8_mma=fp8_mma,
            bf16x3=bf16x3,
        )
        config.check()
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not BLOCK_N,BLOCK_K,WARPS[,SPLIT_K[,STAGES[,dot|dot8|dot3]]][,mBLOCK_M] "
            "(powers of two, SPLIT_K an integer or 'a'; tl.dot needs BLOCK_N, BLOCK_K, "
            "BLOCK_M >= 16, dot8 BLOCK_K >= 32) or 'default'"
        ) from None
    return text, config


def with_fp8_mma(label: str, config: GemvConfig) -> tuple[str, GemvConfig]:
    """The `dot8` twin of a tl.dot config."""
    parts = label.split(",")
    at = parts.index("dot")
    return ",".join(parts[:at] + ["dot8"] + parts[at + 1 :]), replace(config, fp8_mma=True)


def make_weights(
    k: int, n: int, dtype: str, copies: int, device: torch.device, seed: int, rows: int
):
    """`copies` weights (bf16, or FP8 codes with [N, 1] scales) and one input of `rows` rows;
    benchmarks slice the first M rows."""
    gen = torch.Generator(device=device).manual_seed(seed)
    base = torch.randn(n, k, generator=gen, device=device) * k**-0.5
    x = torch.randn(rows, k, generator=gen, device=device)
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


def suggest_max_m(
    rows: list[dict[str, object]], dtype: str, path: str = "gemv", above: int = 0
) -> int | None:
    """Largest M such that, at every shape, the fastest config of `path` ("gemv": multiply-and-
    sum, "dot": tl.dot) beats the vendor GEMM at it and at every smaller measured M above
    `above`; None without both measured above `above` (`above`: none won)."""
    best: dict[tuple[str, int], dict[str, float]] = {}
    for row in rows:
        if row["dtype"] != dtype or row["path"] not in ("vendor", path) or row["m"] <= above:
            continue
        by_path = best.setdefault((str(row["shape"]), int(row["m"])), {})
        kind = str(row["path"])
        by_path[kind] = min(by_path.get(kind, float("inf")), float(row["us"]))
    ms = sorted({m for (_, m), p in best.items() if len(p) == 2})
    if not ms:
        return None
    limit = above
    for m in ms:
        at_m = [p for (_, mm), p in best.items() if mm == m and len(p) == 2]
        if any(p[path] >= p["vendor"] for p in at_m):
            break
        limit = m
    return limit


def best_table(rows: list[dict[str, object]]) -> list[str]:
    """One line per (dtype, shape, M): the fastest GEMV config, its time and % of copy, the
    vendor GEMM's time and the speed-up over it."""
    groups: dict[tuple, dict[str, dict]] = {}
    for row in rows:
        group = groups.setdefault((row["dtype"], row["shape"], row["m"]), {})
        kind = "vendor" if row["path"] == "vendor" else "ours"
        if kind not in group or row["us"] < group[kind]["us"]:
            group[kind] = row
    lines = [f"{'dtype':>5} {'shape':>11} {'M':>4} {'best config':>26} {'us':>8} {'%copy':>6} "
             f"{'vendor us':>9} {'%copy':>6} {'speed-up':>8}"]  # fmt: skip
    for (dtype, shape, m), group in groups.items():
        ours, vendor = group.get("ours"), group.get("vendor")
        if ours is None or vendor is None:
            continue
        lines.append(
            f"{dtype:>5} {shape:>11} {m:>4} {ours['config']:>26} {ours['us']:8.2f} "
            f"{ours['pct_copy']:6.1f} {vendor['us']:9.2f} {vendor['pct_copy']:6.1f} "
            f"{vendor['us'] / ours['us']:7.2f}x"
        )
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--shapes", nargs="+", choices=list(SHAPES), default=list(SHAPES),
        help="model layers whose (K, N) to time (default: all)",
    )  # fmt: skip
    parser.add_argument(
        "--dtypes", nargs="+", choices=["bf16", "fp8"], default=["bf16", "fp8"],
        help="weight dtypes (fp8: the FP8 shapes only)",
    )  # fmt: skip
    parser.add_argument("--m", type=int, nargs="+", default=M_VALUES, help="rows (tokens)")
    parser.add_argument(
        "--configs",
        nargs="+",
        type=gemv_config,
        default=[("default", None)],
        metavar="BN,BK,W[,S[,ST[,dot|dot8]]][,mBM]",
        help="GEMV configs to time (a sweep); default: gemv_config.default_config only",
    )
    parser.add_argument(
        "--dot-sweep", action="store_true", help="add the tl.dot configs of DOT_SWEEP"
    )
    parser.add_argument("--copies", type=int, default=16, help="rotating weight copies (>= 16)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the weights and rows")
    parser.add_argument(
        "--output-json", "--out", dest="output_json", type=output_file,
        help="write the environment, copy bandwidth and rows to this JSON file",
    )  # fmt: skip
    add_common_args(
        parser,
        dry_run="a tiny shape on the CPU, eager timing: checks the script, measures nothing useful",
    )
    args = parser.parse_args(argv)
    if args.dry_run:
        note_dry_run_ignores(parser, args, ignored=("shapes", "copies", "copy_gib"))
        round_like_the_gpu_if_interpreting()
        device, shapes, copies, gib = torch.device("cpu"), DRY_RUN_SHAPES, 2, 1 / 64
    else:
        require_gpu(parser)
        device, copies, gib = torch.device("cuda"), args.copies, args.copy_gib
        shapes = {name: SHAPES[name] for name in args.shapes}
        if copies < 16:
            parser.error(f"--copies must be at least 16 (L2 residency), got {copies}")
    if any(m < 1 or m > max(M_VALUES) for m in args.m):
        parser.error(f"--m values must be in 1..{max(M_VALUES)}")

    if device.type == "cuda":
        copy = copy_gbps(gib)
    else:
        src = torch.empty(int(gib * 2**30), dtype=torch.uint8)
        copy = 2 * src.numel() / (time_eager(lambda: src.clone(), device) * 1e-6) / 1e9
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
    configs = list(args.configs)
    if args.dot_sweep:
        configs += [gemv_config(text) for text in DOT_SWEEP]
        configs += [with_fp8_mma(label, cfg) for label, cfg in configs[-len(DOT_SWEEP) :]]
    with torch.inference_mode():
        for dtype in args.dtypes:
            paths = [("vendor", None, "vendor")] + [
                ("gemv", cfg, label)
                for label, cfg in configs
                if dtype == "fp8" or cfg is None or not cfg.fp8_mma  # dot8 = dot on bf16
            ]
            for name, (k, n) in shapes.items():
                if dtype == "fp8" and name not in FP8_SHAPES and not args.dry_run:
                    continue
                x_all, xs_all, weights, w_scale = make_weights(
                    k, n, dtype, copies, device, args.seed, max(args.m)
                )
                element = weights[0].element_size()
                weight_bytes = n * k * element
                for m in args.m:
                    x = x_all[:m]
                    x_scale = xs_all[:m].contiguous() if xs_all is not None else None
                    for path, config, label in paths:
                        kind = path  # the row's: vendor, gemv (multiply-and-sum) or dot
                        if path != "vendor":
                            used = config or gemv_cfg.default_config(m, n, k, element)
                            kind = "dot" if used.use_dot else "gemv"
                        calls = calls_for(dtype, path, config, x, x_scale, weights, w_scale)

                        def run_all(calls=calls):
                            for call in calls:
                                call()

                        try:
                            if device.type == "cuda":
                                us = time_graph(run_all, 1) / len(calls)
                            else:
                                us = time_eager(run_all, device) / len(calls)
                        # Found at the first (eager) launch: resources, or a grid the config
                        # cannot launch (a ValueError: e.g. 2-channel blocks of the LM head).
                        except (OutOfResources, ValueError) as error:
                            print(f"{dtype:>4} {name:>11} M={m:>3} {label:>26} skipped: {error}")
                            continue
                        gbps = weight_bytes / (us * 1e-6) / 1e9
                        row = dict(dtype=dtype, shape=name, k=k, n=n, m=m, path=kind,
                                   config=label, us=round(us, 2), gbps=round(gbps, 1),
                                   pct_copy=round(100 * gbps / copy, 1),
                                   weight_mb=round(weight_bytes / 1e6, 2))  # fmt: skip
                        rows.append(row)
                        write_csv(args.csv, rows)
                        print(
                            f"{dtype:>4} {name:>11} M={m:>3} {label:>26} {us:9.2f} us "
                            f"{gbps:7.0f} GB/s {row['pct_copy']:5.1f}% of copy",
                            flush=True,
                        )
                del weights
                if device.type == "cuda":
                    torch.cuda.empty_cache()
    print("\n".join(best_table(rows)))
    # The thresholds only reach weights the layers may send to the GEMV at the row's M.
    for dtype in args.dtypes:
        prefix = dtype.upper()
        if dtype == "bf16":
            sendable = [
                r for r in rows if gemv_cfg.bf16_gemv_weight_fits(r["m"], r["n"] * r["k"], r["k"])
            ]
        else:
            sendable = [r for r in rows if r["n"] * r["k"] <= gemv_cfg.FP8_GEMV_MAX_WEIGHT_NUMEL]
        limit = suggest_max_m(sendable, dtype)
        if limit is None:
            continue
        name = f"{prefix}_GEMV_MAX_M"
        record[name] = limit
        print(
            f"{dtype}: the GEMV beats the vendor GEMM at every shape up to M = {limit}: "
            f"{name} = {limit} (now {getattr(gemv_cfg, name)})"
        )
        dot_limit = suggest_max_m(sendable, dtype, "dot", above=limit)
        if dot_limit is not None:
            name = f"{prefix}_DOT_MAX_M"
            record[name] = dot_limit if dot_limit > limit else 0
            won = f"up to M = {dot_limit}" if dot_limit > limit else "at no measured M"
            print(
                f"{dtype}: above it, tl.dot beats the vendor GEMM at every shape {won}: "
                f"{name} = {record[name]} (now {getattr(gemv_cfg, name)})"
            )
    if args.output_json:
        write_json(args.output_json, record, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(run_main(main))
