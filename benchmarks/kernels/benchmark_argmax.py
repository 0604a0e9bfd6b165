"""Benchmark greedy sampling's argmax: `argmax(logits)` (vllm/v1/sample/ops/argmax.py, two
Triton launches) against `torch.argmax(logits, dim=-1)`, on `[N, V]` logits at Kimi-Linear's
vocabulary (V 163840) and the engine's batch sizes.

Two timings per provider, each captured in a CUDA graph so that host time is not measured (the
sampler's launches are eager in the engine, but the host runs ahead of the device at decode):
`graph`, the call replayed back to back (the logits stay in L2 from the previous call, as they
are from the LM head in a decode step, up to L2's 50 MB), and `flushed`, L2 flushed before each
call (every byte from HBM). Bytes are the logits read once; % of copy is against an eager `copy_`
of --copy-gib GiB in the same run. --target-programs sweeps the kernels' chunking (the default is
`TARGET_PROGRAMS`), run at every row count; `argmax()` is the op as the sampler calls it, which
hands more than `MAX_KERNEL_ROWS` rows to torch. Before timing, every provider is checked
against torch on logits with many tied maxima.

    python benchmarks/kernels/benchmark_argmax.py
    python benchmarks/kernels/benchmark_argmax.py --rows 1 256 --dtypes bfloat16 float32

`--dry-run` runs every chunking once at a tiny shape against torch, untimed; without a GPU run it
under the Triton interpreter: TRITON_INTERPRET=1 python ... --dry-run
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
    time_graph,
    write_csv,
)

from vllm.triton_utils import use_triton
from vllm.utils.cli import positive_int, run_main
from vllm.v1.sample.ops.argmax import MAX_KERNEL_ROWS, TARGET_PROGRAMS, argmax, split_count

VOCAB = 163840
DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


def make_logits(rows: int, vocab: int, dtype: torch.dtype, device: str, seed: int = 0):
    """Integers in [-8, 8], so every row has many tied maxima across its chunks."""
    gen = torch.Generator(device=device).manual_seed(seed)
    return torch.randint(-8, 9, (rows, vocab), generator=gen, device=device).to(dtype)


def dry_run(targets: list[int]) -> int:
    device = "cuda" if torch.cuda.is_available() else "cpu"
    logits = make_logits(3, 5000, torch.bfloat16, device)
    expected = logits.argmax(dim=-1)
    ok = all(
        torch.equal(argmax(logits, target_programs=t, max_kernel_rows=3), expected) for t in targets
    )
    path = "Triton" if use_triton(torch.device(device)) else "the torch reference"
    print(
        f"dry run on {device} via {path}: target programs {targets} at N = 3, V = 5000: "
        f"{'equal to' if ok else 'DIFFERENT from'} torch.argmax"
    )
    return 0 if ok else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 8, 64, 256], help="N")
    parser.add_argument("--vocab", type=int, default=VOCAB, help="V")
    parser.add_argument(
        "--dtypes", nargs="+", choices=DTYPES, default=["bfloat16"], help="dtypes of the logits"
    )
    parser.add_argument(
        "--target-programs", type=int, nargs="+",
        default=sorted({512, 1024, TARGET_PROGRAMS, 4096, 8192}),
        help="chunkings of the Triton kernel to time",
    )  # fmt: skip
    parser.add_argument(
        "--calls", type=positive_int, default=20, help="calls per graph replay (graph)"
    )
    parser.add_argument("--reps", type=positive_int, default=50, help="replays per timing")
    add_common_args(
        parser, csv="write one row per (case, provider) to this CSV file",
        dry_run="every chunking once, checked, untimed (CPU too)",
    )  # fmt: skip
    args = parser.parse_args(argv)
    if min(args.rows) < 1 or args.vocab < 1 or min(args.target_programs) < 1:
        parser.error("--rows, --vocab and --target-programs must be positive")
    if args.dry_run:
        note_dry_run_ignores(parser, args, used=("target_programs",))
        round_like_the_gpu_if_interpreting()
        return dry_run(args.target_programs)
    require_gpu(parser)
    copy = print_copy_gbps(args.copy_gib)
    rows_out = []
    with torch.inference_mode():
        for dtype_name in args.dtypes:
            for rows in args.rows:
                logits = make_logits(rows, args.vocab, DTYPES[dtype_name], "cuda", seed=rows)
                expected = logits.argmax(dim=-1)
                providers = {
                    "torch": lambda x=logits: x.argmax(dim=-1),
                    f"argmax() (kernels up to {MAX_KERNEL_ROWS} rows)": lambda x=logits: argmax(x),
                }
                for target in args.target_programs:
                    splits = split_count(rows, args.vocab, target)[0]
                    label = f"triton t{target} (S {splits})"
                    if target == TARGET_PROGRAMS:
                        label += " default"
                    providers[label] = lambda x=logits, t=target, n=rows: argmax(
                        x, target_programs=t, max_kernel_rows=n
                    )
                for label, fn in providers.items():
                    if not torch.equal(fn(), expected):
                        print(f"{dtype_name} N {rows}: {label} differs from torch.argmax")
                        return 1
                moved = logits.numel() * logits.element_size()
                print(f"{dtype_name} N {rows} V {args.vocab}: {moved / 1e6:.2f} MB read a call")
                times = {}
                for label, fn in providers.items():
                    graph_us = time_graph(fn, args.calls, args.reps)
                    flushed_us = time_flushed(fn, args.reps)
                    times[label] = graph_us
                    pct = 100 * moved / flushed_us / 1e3 / copy
                    record = dict(dtype=dtype_name, rows=rows, provider=label)
                    record.update(graph_us=round(graph_us, 2), flushed_us=round(flushed_us, 2))
                    rows_out.append(dict(record, pct_copy_flushed=round(pct, 1)))
                    write_csv(
                        args.csv, rows_out
                    )  # after every row: an interrupted run keeps its rows
                    print(
                        f"  {label:>24}: graph {graph_us:7.2f} us, flushed {flushed_us:7.2f} us "
                        f"({pct:5.1f}% of copy)",
                        flush=True,
                    )
                best = min((k for k in times if k.startswith("triton")), key=times.get)
                print(
                    f"{dtype_name} N {rows}: torch {times['torch']:.2f} us, best {best} "
                    f"{times[best]:.2f} us ({times['torch'] / times[best]:.2f}x)"
                )
    return 0


if __name__ == "__main__":
    sys.exit(run_main(main))
