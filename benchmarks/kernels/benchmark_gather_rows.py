"""Benchmark the grouped MoE prefill's row gather: `gather_rows(x, order, k)` against torch's
`x.index_select(0, order // k)`, at Kimi-Linear's sizes (H 2304 bf16, 9 slots: top-8 plus the
fused shared expert, 257 experts).

`order` is `group_rows`'s expert-sorted order of random routings, as `moe_experts_grouped` makes
it. Each call is captured once in a CUDA graph and replayed with L2 flushed before each replay.
Bytes are what must cross HBM: x read once (each of its rows is read k times, the repeats from
L2) and the output written; for the same-size copy, its output read and written. Two yardsticks
from the same run: `copy_` of a tensor the output's size (same flushed timing) and an eager
`copy_` of --copy-gib GiB (the device's bandwidth, read + write). --configs sweeps launches
(`block_rows,block_cols,num_warps`, or `default`); each size's last line names the fastest, to
update `DEFAULT_GATHER_ROWS_CONFIG`. Before timing, each launch is checked bit for bit against
index_select.

    python benchmarks/kernels/benchmark_gather_rows.py
    python benchmarks/kernels/benchmark_gather_rows.py --tokens 8192 --configs default 8,512,4

`--dry-run` runs every config once at a tiny shape against the reference, untimed; without a GPU
run it under the Triton interpreter: TRITON_INTERPRET=1 python ... --dry-run
"""

import argparse
import sys

import torch
from kernel_bench import (
    add_common_args,
    note_dry_run_ignores,
    print_copy_gbps,
    require_gpu,
    round_like_the_gpu_if_interpreting,
    time_flushed,
    write_csv,
)

from vllm.model_executor.layers.fused_moe.gather_rows import (
    DEFAULT_GATHER_ROWS_CONFIG,
    GatherRowsConfig,
    gather_rows,
)
from vllm.model_executor.layers.fused_moe.group_rows import group_rows
from vllm.triton_utils import use_triton
from vllm.utils.cli import positive_int, run_main

HIDDEN, TOPK, EXPERTS = 2304, 9, 257
CONFIGS = [
    "default", "8,256,4", "32,256,8", "8,512,4", "16,512,8", "4,1024,4", "8,1024,8", "2,1024,4",
]  # fmt: skip


def parse_config(text: str) -> GatherRowsConfig:
    if text == "default":
        return DEFAULT_GATHER_ROWS_CONFIG
    block_rows, block_cols, num_warps = map(int, text.split(","))
    return GatherRowsConfig(block_rows, block_cols, num_warps)


def name(config: GatherRowsConfig) -> str:
    return f"r{config.block_rows}c{config.block_cols}w{config.num_warps}"


def make_case(tokens: int, hidden: int, device: str, seed: int = 0):
    """x `[T, H]` bf16 and the expert-sorted int32 `order` of a random top-K routing."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(tokens, hidden, generator=gen).to(torch.bfloat16)
    ids = torch.rand(tokens, EXPERTS, generator=gen).topk(TOPK, dim=1)[1]
    order = group_rows(ids.to(device), EXPERTS, block_m=16)[0]
    return x.to(device), order


def dry_run(configs: list[GatherRowsConfig]) -> int:
    device = "cuda" if torch.cuda.is_available() else "cpu"
    x, order = make_case(5, 40, device)
    expected = x.index_select(0, order // TOPK)
    ok = all(torch.equal(gather_rows(x, order, TOPK, config=c), expected) for c in configs)
    path = "Triton" if use_triton(torch.device(device)) else "the torch reference"
    print(
        f"dry run on {device} via {path}: {' '.join(map(name, configs))} at T = 5, K = {TOPK}, "
        f"H = 40: {'bit-equal to' if ok else 'DIFFERENT from'} index_select"
    )
    return 0 if ok else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--tokens", type=positive_int, nargs="+", default=[1024, 8192], help="prefill T"
    )
    parser.add_argument(
        "--configs", nargs="+", default=CONFIGS,
        help="launches to time, as block_rows,block_cols,num_warps or `default`",
    )  # fmt: skip
    parser.add_argument("--reps", type=positive_int, default=50, help="flushed replays per timing")
    add_common_args(
        parser, csv="write one row per (size, provider) to this CSV file",
        dry_run="every config once, checked, untimed (CPU too)",
    )  # fmt: skip
    args = parser.parse_args(argv)
    try:
        configs = list(dict.fromkeys(parse_config(c) for c in args.configs))
    except ValueError:
        parser.error("--configs are block_rows,block_cols,num_warps (powers of two) or default")
    if args.dry_run:
        note_dry_run_ignores(parser, args, used=("configs",))
        round_like_the_gpu_if_interpreting()
        return dry_run(configs)
    require_gpu(parser)
    copy = print_copy_gbps(args.copy_gib)
    rows = []
    with torch.inference_mode():
        for tokens in args.tokens:
            x, order = make_case(tokens, HIDDEN, "cuda", seed=tokens)
            expected = x.index_select(0, order // TOPK)
            for config in configs:
                if not torch.equal(gather_rows(x, order, TOPK, config=config), expected):
                    print(f"T {tokens}: {name(config)} differs from index_select")
                    return 1
            src, dst = torch.empty_like(expected), torch.empty_like(expected)
            providers = {
                "copy_same_size": lambda src=src, dst=dst: dst.copy_(src),
                "index_select": lambda x=x, order=order: x.index_select(0, order // TOPK),
            }
            for config in configs:
                providers[name(config)] = lambda x=x, order=order, c=config: gather_rows(
                    x, order, TOPK, config=c
                )
            written = expected.numel() * expected.element_size()
            gathered = written + x.numel() * x.element_size()
            print(f"T {tokens}, K {TOPK}, H {HIDDEN}: {written / 1e6:.0f} MB written a call")
            times = {}
            for label, fn in providers.items():
                moved = 2 * written if label == "copy_same_size" else gathered
                us = time_flushed(fn, reps=args.reps)
                times[label] = us
                gbps = moved / us / 1e3
                pct_same = 100 * times["copy_same_size"] / us
                row = dict(tokens=tokens, provider=label, us=round(us, 2), gbps=round(gbps))
                rows.append(
                    dict(row, pct_copy=round(100 * gbps / copy, 1), pct_same=round(pct_same, 1))
                )
                write_csv(args.csv, rows)  # after every row: an interrupted run keeps its rows
                mark = " (default)" if label == name(DEFAULT_GATHER_ROWS_CONFIG) else ""
                print(
                    f"  {label:>15}: {us:8.1f} us {gbps:6.0f} GB/s {100 * gbps / copy:5.1f}% of "
                    f"copy, {pct_same:5.1f}% of same-size copy{mark}",
                    flush=True,
                )
            best = min((name(c) for c in configs), key=times.get)
            print(
                f"T {tokens}: best {best} {times[best]:.1f} us, default "
                f"{times.get(name(DEFAULT_GATHER_ROWS_CONFIG), float('nan')):.1f} us, index_select "
                f"{times['index_select']:.1f} us ({times['index_select'] / times[best]:.2f}x)"
            )
    return 0


if __name__ == "__main__":
    sys.exit(run_main(main))
