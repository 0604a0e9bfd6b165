"""Benchmark the KDA prefill's causal conv1d + SiLU (`causal_conv1d_prefill`) on Kimi-Linear-48B.

Shape of one KDA layer's prefill at TP 1: x is the q | k | v columns (3 x 4096) of the in_proj
output `[T, 12576]` bf16 (q, k, v, f_a, g_a, b: a row stride wider than the slice), weight
`[12288, 4]` fp32, a bf16 conv state pool, the output written as three `[T, 4096]` tensors (the
layer's `out` `[3, T, 4096]`). T = 8192 as one sequence and as 8 of 1024 (every other one a
continued prefill from its state).

Each call is captured once in a CUDA graph and replayed with L2 flushed before each replay (the
input comes from HBM, as after the in_proj GEMM of a long prefill). Bytes are x read plus the
output written (the state and weights are a few hundred KB); the bandwidth is reported against
an eager `copy_` of --copy-gib GiB measured in the same run after a warm-up. --configs sweeps
launches (`block_t,block_c,num_warps[,step]`, step 4 when left out, or `default` for
`DEFAULT_PREFILL_CONFIG`); the last line of each case names the fastest, to update
`DEFAULT_PREFILL_CONFIG`. Before timing, each case checks the default launch against the torch
reference.

    python benchmarks/kernels/benchmark_causal_conv1d.py --csv conv.csv
    python benchmarks/kernels/benchmark_causal_conv1d.py --configs default 64,1024,4,4 --seqs 1

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

from vllm.models.kimi_k3.amd.ops.causal_conv1d import (
    DEFAULT_PREFILL_CONFIG,
    Conv1dPrefillConfig,
    causal_conv1d_prefill,
    causal_conv1d_prefill_ref,
)
from vllm.triton_utils import use_triton
from vllm.utils.cli import positive_int, run_main

HEADS, HEAD_DIM, WIDTH = 32, 128, 4
# in_proj columns after q | k | v: f_a (head_dim), g_a (head_dim), b (heads).
EXTRA_COLUMNS = 2 * HEAD_DIM + HEADS
# Around the default (64 tokens, 512 channels, 4 warps, 8-row steps): 4 or 8 channels a thread,
# 4 or 8 rows in flight, 32-256 tokens a program.
CONFIGS = [
    "default", "64,1024,4,4", "32,1024,4,8", "128,1024,4,8", "256,1024,4,8", "64,512,4,8",
    "128,512,4,8", "64,2048,8,8", "64,512,2,8", "32,256,4,4",
]  # fmt: skip


def parse_config(text: str) -> Conv1dPrefillConfig:
    if text == "default":
        return DEFAULT_PREFILL_CONFIG
    return Conv1dPrefillConfig(*map(int, text.split(",")))


def make_case(tokens: int, seqs: int, channels: int, device: str, seed: int = 0):
    """One layer's prefill inputs (keyword arguments of `causal_conv1d_prefill`) and its `out`."""
    gen = torch.Generator(device=device).manual_seed(seed)
    dev = dict(device=device)
    proj = torch.randn(tokens, channels + EXTRA_COLUMNS, generator=gen, **dev)
    lens = [tokens // seqs] * seqs
    lens[-1] += tokens - sum(lens)
    qsl = torch.tensor([0, *lens]).cumsum(0).to(device)
    state = torch.randn(seqs + 1, channels, WIDTH - 1, generator=gen, **dev)
    inputs = dict(
        x=proj.to(torch.bfloat16)[:, :channels],
        weight=torch.randn(channels, WIDTH, generator=gen, **dev) * 0.5,
        conv_state=state.to(torch.bfloat16),
        query_start_loc=qsl,
        slots=torch.arange(1, seqs + 1, **dev),
        has_initial_state=torch.arange(seqs, **dev) % 2 == 1,
    )
    out = torch.empty(3, tokens, channels // 3, dtype=torch.bfloat16, **dev)
    return inputs, out


def max_error(inputs, out: torch.Tensor, config: Conv1dPrefillConfig) -> float:
    """Max |kernel - reference| / (1 + |reference|) of one call's output (bf16 on both sides:
    at most one ulp, 2**-7 relative), or inf if the new states differ (they only move values)."""
    ref_state, got_state = inputs["conv_state"].clone(), inputs["conv_state"].clone()
    args = {k: v for k, v in inputs.items() if k != "conv_state"}
    ref = causal_conv1d_prefill_ref(conv_state=ref_state, **args)
    causal_conv1d_prefill(conv_state=got_state, out=out, config=config, **args)
    got = out.transpose(0, 1).reshape(ref.shape)
    if not torch.equal(got_state, ref_state):
        return float("inf")
    return ((got.float() - ref.float()).abs() / (1 + ref.float().abs())).max().item()


def name(config: Conv1dPrefillConfig) -> str:
    return f"t{config.block_t}c{config.block_c}w{config.num_warps}s{config.step}"


def dry_run(configs: list[Conv1dPrefillConfig]) -> int:
    device = "cuda" if torch.cuda.is_available() else "cpu"
    inputs, out = make_case(45, 3, 48, device)
    err = max(max_error(inputs, out, config) for config in configs)
    path = "Triton" if use_triton(torch.device(device)) else "the torch reference"
    print(
        f"dry run on {device} via {path}: {' '.join(map(name, configs))} at T = 45, C = 48, "
        f"3 sequences: max |diff| {err:.2e} of 1 + |ref| (bf16)"
    )
    return 0 if err <= 2**-7 else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--tokens", type=positive_int, default=8192, help="prefill tokens")
    parser.add_argument(
        "--seqs", type=positive_int, nargs="+", default=[1, 8], help="sequences in T"
    )
    parser.add_argument(
        "--configs", nargs="+", default=CONFIGS,
        help="launches to time, as block_t,block_c,num_warps[,step] or `default`",
    )  # fmt: skip
    parser.add_argument("--reps", type=positive_int, default=30, help="flushed replays per timing")
    add_common_args(
        parser, csv="write one row per (case, config) to this CSV file",
        dry_run="every config once, checked, untimed (CPU too)",
    )  # fmt: skip
    args = parser.parse_args(argv)
    try:
        configs = list(dict.fromkeys(parse_config(c) for c in args.configs))
    except (TypeError, ValueError):
        parser.error("--configs are block_t,block_c,num_warps[,step] (e.g. 64,1024,4,8) or default")
    if args.dry_run:
        note_dry_run_ignores(parser, args, used=("configs",))
        round_like_the_gpu_if_interpreting()
        return dry_run(configs)
    require_gpu(parser)
    copy = print_copy_gbps(args.copy_gib)
    channels = 3 * HEADS * HEAD_DIM
    moved = 2 * args.tokens * channels * 2  # x read + output written, bf16
    print(f"T = {args.tokens}, C = {channels}, W = {WIDTH}: {moved / 1e6:.0f} MB a call")
    rows = []
    with torch.inference_mode():
        for seqs in args.seqs:
            inputs, out = make_case(args.tokens, seqs, channels, "cuda", seed=seqs)
            err = max_error(inputs, out, DEFAULT_PREFILL_CONFIG)
            if err > 2**-7:
                print(f"{seqs} seqs: the default launch is off the reference by {err:.2e}")
                return 1
            times = {}
            for config in configs:

                def call(c=config, inputs=inputs, out=out):
                    return causal_conv1d_prefill(**inputs, out=out, config=c)

                us = time_flushed(call, reps=args.reps)
                times[config] = us
                gbps = moved / us / 1e3
                row = dict(tokens=args.tokens, seqs=seqs, config=name(config), us=round(us, 2))
                rows.append(dict(row, gbps=round(gbps), pct_copy=round(100 * gbps / copy, 1)))
                write_csv(args.csv, rows)  # after every row: an interrupted run keeps its rows
                mark = " (default)" if config == DEFAULT_PREFILL_CONFIG else ""
                print(
                    f"  seqs {seqs:>2} {name(config):>12}: {us:8.1f} us {gbps:6.0f} GB/s "
                    f"{100 * gbps / copy:5.1f}% of copy{mark}",
                    flush=True,
                )
            best = min(times, key=times.get)
            print(
                f"seqs {seqs}: best {name(best)} {times[best]:.1f} us "
                f"({100 * moved / times[best] / 1e3 / copy:.1f}% of copy); default "
                f"{times.get(DEFAULT_PREFILL_CONFIG, float('nan')):.1f} us"
            )
    return 0


if __name__ == "__main__":
    sys.exit(run_main(main))
