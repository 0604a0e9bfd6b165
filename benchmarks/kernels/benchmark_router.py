"""Benchmark the MoE router: `grouped_topk_triton` (one kernel) against `grouped_topk_ref` (the
torch reference: ~12 launches, two `topk` sorts) on Kimi-Linear-48B's router.

Router: 256 experts, top-8, sigmoid, score-correction bias, renormalised, scaling 2.446, one
expert group (--groups / --topk-group for a grouped variant); fp32 logits of T tokens.

Both are timed as CUDA-graph replay of --graph-calls back-to-back calls (what a decode step pays).
Bytes are the logits and bias read plus the weights and ids written; the bandwidth is reported
against an eager `copy_` of --copy-gib GiB measured in the same run after a warm-up. At decode
sizes the router moves a few KB, so the microseconds (launch-bound) are the number to read; the
percentage shows how far from streaming it is. Before timing, each size checks that the kernel
and the reference choose the same experts.

    python benchmarks/kernels/benchmark_router.py --csv router.csv
    python benchmarks/kernels/benchmark_router.py --warps 1 2 4 --tokens 64 256
    python benchmarks/kernels/benchmark_router.py --dry-run     # tiny, CPU, no GPU needed
"""

import argparse
import functools
import sys

import torch
from benchmark_moe import copy_bandwidth, time_eager
from benchmark_rmsnorm_gated_fp8_per_token import time_graph, write_csv

from vllm.model_executor.layers.fused_moe.router import grouped_topk_ref, grouped_topk_triton
from vllm.triton_utils import use_triton

TOKENS = [1, 8, 64, 256]
KIMI_LINEAR = dict(experts=256, top_k=8, routed_scaling_factor=2.446)


def make_inputs(tokens: int, experts: int, device: torch.device, seed: int):
    gen = torch.Generator(device=device).manual_seed(seed)
    logits = torch.randn(tokens, experts, generator=gen, device=device)
    bias = torch.randn(experts, generator=gen, device=device) * 0.1
    return logits, bias


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--tokens", type=int, nargs="+", default=TOKENS, help="tokens per call")
    parser.add_argument("--experts", type=int, default=KIMI_LINEAR["experts"])
    parser.add_argument("--top-k", type=int, default=KIMI_LINEAR["top_k"])
    parser.add_argument("--groups", type=int, default=1, help="num_expert_group")
    parser.add_argument("--topk-group", type=int, default=1)
    parser.add_argument(
        "--warps", type=int, nargs="+", help="time the kernel at each num_warps (default: its own)"
    )
    parser.add_argument("--graph-calls", type=int, default=20, help="calls per captured graph")
    parser.add_argument("--copy-gib", type=float, default=2.0, help="size of the copy baseline")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--csv", help="write the results to this CSV file")
    parser.add_argument(
        "--dry-run",
        action="store_true",
        help="32 experts, top-4, on the CPU (kernel under TRITON_INTERPRET=1), eager timing: "
        "checks the script, measures nothing useful",
    )
    args = parser.parse_args(argv)
    if args.copy_gib < 1:
        # Smaller copies partly hit L2 and under-report the HBM bandwidth.
        parser.error(f"--copy-gib must be at least 1, got {args.copy_gib}")
    if args.dry_run:
        device, tokens_list, copy_gib = torch.device("cpu"), [1, 3], 1 / 64
        args.experts, args.top_k = 32, 4
    elif torch.cuda.is_available():
        device, tokens_list, copy_gib = torch.device("cuda"), args.tokens, args.copy_gib
    else:
        parser.error("this benchmark needs a CUDA GPU (or --dry-run)")
    if not use_triton(device):
        parser.error("the kernel runs on CPU only under TRITON_INTERPRET=1")

    router = dict(
        top_k=args.top_k, num_expert_group=args.groups, topk_group=args.topk_group,
        renormalize=True, routed_scaling_factor=KIMI_LINEAR["routed_scaling_factor"],
    )  # fmt: skip
    impls = [("reference", grouped_topk_ref)]
    for warps in args.warps or [None]:
        name = "kernel" if warps is None else f"kernel[w{warps}]"
        impls.append((name, functools.partial(grouped_topk_triton, num_warps=warps)))

    copy_gbps = copy_bandwidth(copy_gib, device)
    print(f"{device.type}: eager copy_ of {copy_gib:g} GiB: {copy_gbps:.0f} GB/s", flush=True)
    rows = []
    with torch.inference_mode():
        for tokens in tokens_list:
            logits, bias = make_inputs(tokens, args.experts, device, args.seed)
            ref_w, ref_ids = grouped_topk_ref(logits, bias, **router)
            moved = (logits.numel() + bias.numel()) * 4 + ref_ids.numel() * (4 + 8)
            for name, impl in impls:
                weights, ids = impl(logits, bias, **router)
                if not torch.equal(ids, ref_ids):
                    raise SystemExit(f"T={tokens} {name}: expert ids differ from the reference")
                torch.testing.assert_close(weights, ref_w, rtol=8 * 2**-23, atol=0.0)

                def call(impl=impl, logits=logits, bias=bias):
                    return impl(logits, bias, **router)

                graphed = device.type == "cuda"
                us = time_graph(call, args.graph_calls) if graphed else time_eager(call, device)
                gbps = moved / (us * 1e-6) / 1e9
                row = dict(tokens=tokens, experts=args.experts, top_k=args.top_k,
                           groups=args.groups, path=name, timing="graph" if graphed else "eager",
                           us=round(us, 2), bytes=moved, gbps=round(gbps, 2),
                           pct_copy=round(100 * gbps / copy_gbps, 2),
                           copy_gbps=round(copy_gbps, 1))  # fmt: skip
                rows.append(row)
                write_csv(args.csv, rows)  # after every row: an interrupted run keeps its rows
                print(
                    f"T={tokens:>4} {name:>12} ({row['timing']}) {us:9.2f} us  "
                    f"{moved / 1e3:8.1f} KB  {gbps:7.2f} GB/s  {row['pct_copy']:6.2f}% of copy",
                    flush=True,
                )
    return 0


if __name__ == "__main__":
    sys.exit(main())
