"""Benchmark the batched GEMV (`gemv_batched`, vllm/model_executor/kernels/linear/gemv.py) against
`torch.bmm` (cuBLAS) on MLA's absorbed per-head products at decode, Kimi-Linear-48B's sizes:

  w_uk   q_nope `[32, M, 128]` x W_UK `[32, 512, 128]` -> q_latent `[32, M, 512]`
  w_uv   o_latent `[32, M, 512]` x W_UV `[32, 128, 512]` -> out `[32, M, 128]`, written through the
         transposed view of `[M, 32, 128]` rows, as the layer does

The inputs are the transposed views the layer passes. Timing: CUDA-graph replay of one call per
weight copy over --copies rotating copies (so consecutive calls do not find their weight in L2),
microseconds per call; bandwidth counts the weight bytes against an eager `copy_` of --copy-gib
GiB in the same run.

    python benchmarks/kernels/benchmark_gemv_batched.py
    python benchmarks/kernels/benchmark_gemv_batched.py --m 1 2 4 8 16 \\
        --configs default 64,128,4,1,1 32,128,4,1,1 16,512,4,1,1 8,512,4,1,1
    python benchmarks/kernels/benchmark_gemv_batched.py --dry-run    # tiny shapes on the CPU

A config is benchmark_gemv.py's `BLOCK_N,BLOCK_K,WARPS[,SPLIT_K[,STAGES]]` (multiply-and-sum, no
K splits) or `default` (gemv_config.batched_config); a config a shape cannot take is skipped.
"""

import argparse
import sys

import torch
from benchmark_gemv import gemv_config
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

from vllm.model_executor.kernels.linear import gemv_config as gemv_cfg
from vllm.model_executor.kernels.linear.gemv import gemv_batched
from vllm.utils.cli import output_file, run_main, write_json

SHAPES = {"w_uk": (32, 512, 128), "w_uv": (32, 128, 512)}  # name -> (heads, N, K)
DRY_RUN_SHAPES = {"tiny": (2, 16, 32)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--shapes", nargs="+", choices=list(SHAPES), default=list(SHAPES),
        help="model shapes to time (default: all)",
    )  # fmt: skip
    parser.add_argument("--m", type=int, nargs="+", default=[1, 2, 4, 8, 16, 64], help="rows")
    parser.add_argument(
        "--configs", nargs="+", type=gemv_config, default=[("default", None)],
        metavar="BN,BK,W[,S[,ST]]", help="GEMV configs to time; default: batched_config only",
    )  # fmt: skip
    parser.add_argument("--copies", type=int, default=16, help="rotating weight copies (>= 16)")
    parser.add_argument(
        "--output-json", type=output_file, help="write the copy bandwidth and rows to this file"
    )
    add_common_args(
        parser,
        dry_run="a tiny shape on the CPU, eager timing: checks the script, measures nothing useful",
    )
    args = parser.parse_args(argv)
    if args.dry_run:
        note_dry_run_ignores(parser, args, ignored=("shapes", "copies", "copy_gib"))
        round_like_the_gpu_if_interpreting()
        device, shapes, copies = torch.device("cpu"), DRY_RUN_SHAPES, 2
    else:
        require_gpu(parser)
        device, copies = torch.device("cuda"), args.copies
        shapes = {name: SHAPES[name] for name in args.shapes}
        if copies < 16:
            parser.error(f"--copies must be at least 16 (L2 residency), got {copies}")
    if any(m < 1 for m in args.m):
        parser.error("--m values must be positive")
    copy = copy_gbps(args.copy_gib) if device.type == "cuda" else float("nan")
    print(f"{device.type}: eager copy_ of {args.copy_gib:g} GiB: {copy:.0f} GB/s", flush=True)
    rows: list[dict[str, object]] = []
    gen = torch.Generator(device=device).manual_seed(0)
    with torch.inference_mode():
        for name, (heads, n, k) in shapes.items():
            weights = [
                torch.randn(heads, n, k, generator=gen, device=device).to(torch.bfloat16)
                for _ in range(copies)
            ]
            weight_bytes = weights[0].numel() * weights[0].element_size()
            for m in args.m:
                # The layer's views: [M, heads, K + 64] rows (q's nope columns of nope + rope),
                # and [M, heads, N] output rows.
                x = torch.randn(m, heads, k + 64, generator=gen, device=device)
                x = x.to(torch.bfloat16)[..., :k].transpose(0, 1)
                out = torch.empty(m, heads, n, dtype=torch.bfloat16, device=device).transpose(0, 1)
                paths = [("bmm", None)] + list(args.configs)
                for label, config in paths:
                    if label == "bmm":
                        calls = [
                            lambda w=w, x=x, out=out: torch.bmm(x, w.transpose(1, 2), out=out)
                            for w in weights
                        ]
                    else:
                        calls = [
                            lambda w=w, x=x, out=out, c=config: gemv_batched(
                                x, w, out=out, config=c
                            )
                            for w in weights
                        ]

                    def run_all(calls=calls):
                        for call in calls:
                            call()

                    try:
                        run_all()
                        if device.type == "cuda":
                            us = time_graph(run_all, 1) / len(calls)
                        else:
                            us = time_eager(run_all, device) / len(calls)
                    except ValueError as error:  # a config the shape cannot launch
                        print(f"{name} M={m:>3} {label:>16} skipped: {error}")
                        continue
                    used = config or gemv_cfg.batched_config(heads, m, n, k)
                    gbps = weight_bytes / (us * 1e-6) / 1e9
                    row = dict(shape=name, heads=heads, n=n, k=k, m=m, config=label,
                               block_n=None if label == "bmm" else used.block_n,
                               us=round(us, 2), gbps=round(gbps, 1),
                               pct_copy=round(100 * gbps / copy, 1))  # fmt: skip
                    rows.append(row)
                    write_csv(args.csv, rows)
                    print(
                        f"{name} M={m:>3} {label:>16} {us:8.2f} us {gbps:7.0f} GB/s "
                        f"{row['pct_copy']:5.1f}% of copy",
                        flush=True,
                    )
            del weights
    best: dict[tuple, dict] = {}
    for row in rows:
        key = (row["shape"], row["m"], row["config"] == "bmm")
        if key not in best or row["us"] < best[key]["us"]:
            best[key] = row
    for (shape, m, is_bmm), row in sorted(best.items()):
        if is_bmm or (shape, m, True) not in best:
            continue
        bmm = best[(shape, m, True)]["us"]
        print(f"{shape} M={m}: best GEMV {row['config']} {row['us']} us, bmm {bmm} us, "
              f"{bmm / row['us']:.2f}x")  # fmt: skip
    if args.output_json:
        write_json(args.output_json, {"copy_gbps": round(copy, 1), "rows": rows}, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(run_main(main))
