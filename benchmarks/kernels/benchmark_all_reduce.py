"""All-reduce of a decode step's hidden states over the GPUs of one host (NCCL through
`torch.distributed`, one process per GPU), eager and as CUDA-graph replay: the cost a TP > 1
decode step pays twice per layer (after attention and after the MLP).

For each token count T the message is `[T, hidden]` in bf16; a graph holds `--graph-calls`
all-reduces back to back, so replay time / calls is the per-call device time without launch
overhead. Rank 0 prints the table and writes the CSV.

    python benchmarks/kernels/benchmark_all_reduce.py --tokens 1 8 64 256 --csv all_reduce.csv
    python benchmarks/kernels/benchmark_all_reduce.py --dry-run   # gloo on the CPU, 2 processes
"""

import argparse
import os
import statistics
import sys
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from kernel_bench import write_csv

from vllm.utils.cli import output_file, positive_int, run_main

HIDDEN = 2304  # Kimi-Linear-48B-A3B


def _time(fn, device: torch.device, reps: int) -> float:
    """Median seconds of `fn` after a warm-up; all ranks step together."""
    for _ in range(3):
        fn()
    times = []
    for _ in range(reps):
        dist.barrier()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        start = time.perf_counter()
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def _worker(rank: int, world: int, port: int, args: argparse.Namespace) -> None:
    dry = args.dry_run
    device = torch.device("cpu") if dry else torch.device("cuda", rank)
    if not dry:
        torch.cuda.set_device(device)
    store = dist.TCPStore("127.0.0.1", port, world, is_master=False)
    dist.init_process_group(
        "gloo" if dry else "nccl", store=store, rank=rank, world_size=world,
        device_id=None if dry else device,
    )  # fmt: skip
    rows = []
    for tokens in args.tokens:
        x = torch.ones(tokens, args.hidden, dtype=torch.bfloat16, device=device)
        eager_s = _time(lambda x=x: dist.all_reduce(x), device, args.reps)
        x.fill_(1.0)  # the timed calls left world^calls in it
        dist.all_reduce(x)
        if not bool((x == world).all()):
            raise RuntimeError(f"rank {rank}: all-reduce of ones did not give {world}")
        graph_us = None
        if not dry:
            stream = torch.cuda.Stream()
            stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(stream):
                for _ in range(3):  # NCCL's warm-up must happen outside capture
                    dist.all_reduce(x)
            torch.cuda.current_stream().wait_stream(stream)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                for _ in range(args.graph_calls):
                    dist.all_reduce(x)
            graph_s = _time(graph.replay, device, args.reps)
            graph_us = 1e6 * graph_s / args.graph_calls
        rows.append(
            {
                "tokens": tokens,
                "bytes": x.numel() * x.element_size(),
                "eager_us": 1e6 * eager_s,
                "graph_us": graph_us,
            }
        )
    if rank == 0:
        for r in rows:
            graph = "-" if r["graph_us"] is None else f"{r['graph_us']:.1f}"
            print(
                f"T={r['tokens']:>5} {r['bytes']:>9} B: eager {r['eager_us']:.1f} us, "
                f"graph {graph} us per all-reduce ({world} ranks)",
                flush=True,
            )
        write_csv(args.csv, rows)
    dist.destroy_process_group()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--tokens", type=positive_int, nargs="+", default=[1, 8, 64, 256],
        help="tokens per all-reduce (rows of --hidden values)",
    )  # fmt: skip
    parser.add_argument(
        "--hidden", type=positive_int, default=HIDDEN, help="hidden size of a token"
    )
    parser.add_argument("--world-size", type=int, default=None, help="GPUs (default: all)")
    parser.add_argument(
        "--graph-calls", type=positive_int, default=50, help="all-reduces per graph"
    )
    parser.add_argument("--reps", type=positive_int, default=20, help="timed repetitions")
    parser.add_argument("--csv", type=output_file, help="write the results to this CSV file")
    parser.add_argument(
        "--dry-run", action="store_true", help="gloo on the CPU with 2 processes, tiny sizes"
    )
    args = parser.parse_args(argv)
    if args.dry_run:
        args.world_size, args.tokens, args.hidden, args.reps = 2, [1, 3], 8, 2
    elif not torch.cuda.is_available():
        parser.error("this benchmark needs GPUs: run it on a machine with 2+, or use --dry-run")
    world = args.world_size or torch.cuda.device_count()
    if world < 2:
        parser.error(f"an all-reduce needs 2+ ranks, got {world}")
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")  # keep NVLink multicast off (shared hosts)
    # The rendezvous store binds an OS-picked port before the ranks start (none is released
    # between choosing and binding it).
    store = dist.TCPStore("127.0.0.1", 0, world, is_master=True, wait_for_workers=False)
    mp.spawn(_worker, args=(world, store.port, args), nprocs=world, join=True)
    return 0


if __name__ == "__main__":
    sys.exit(run_main(main))
