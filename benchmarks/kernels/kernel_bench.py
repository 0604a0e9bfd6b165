"""What the kernel benchmarks in this folder share: timing a call (CUDA-graph replay on the GPU,
with or without L2 flushed before each call, or eager on either device), the eager copy bandwidth
that their % of copy is against, the CSV they rewrite after every row, and the command-line pieces
they all have (--copy-gib, --csv, --dry-run, the refusal without a GPU, the copy line they print
first).

The scripts import it as a sibling, as run from this folder. It imports only the standard library,
torch, `vllm.utils.gc_utils` (its captures pause the garbage collector) and `vllm.utils.cli`
(whose `output_file` checks --csv as it checks the engine benchmarks' --output-json), so a script
can import it at its top and still run --dry-run on a CPU without Triton.
"""

import argparse
import math
import os
import statistics
import sys
import time
from collections.abc import Callable
from csv import DictWriter

import torch

from vllm.utils.cli import given_flags, output_file, replaced_whole
from vllm.utils.gc_utils import collector_paused

# Seconds of replays between a capture and its timing. Right after a new set of expert weights
# was made, the first timing of them (50 replays, about 50 ms) took 17% longer than every later
# one, of those tensors and of others made before them (Kimi-K3's two tokens on an H100: 104.72
# against 89.3-89.7 us; docs/performance.md "Forty-eighth run", calls 191-193): warm-up replays
# keep that transient out of the figures.
WARM_UP_S = 0.2


def _capture(fn: Callable[[], object], calls: int) -> torch.cuda.CUDAGraph:
    """`fn` called `calls` times in one CUDA graph (automatic garbage collection paused:
    `collector_paused`), after three eager calls (compiles, lazy allocations), the graph then
    replayed for `WARM_UP_S` before it is returned."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with collector_paused(), torch.cuda.graph(graph):
        for _ in range(calls):
            fn()
    deadline = time.perf_counter() + WARM_UP_S
    while True:
        graph.replay()
        torch.cuda.synchronize()
        if time.perf_counter() >= deadline:
            return graph


def time_graph(fn: Callable[[], object], calls: int, reps: int = 50) -> float:
    """Median microseconds per call of `fn`, replayed `calls` times in one CUDA graph."""
    graph = _capture(fn, calls)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(reps):
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3 / calls)
    return statistics.median(times)


_FLUSH = None


def time_flushed(fn: Callable[[], object], reps: int = 100) -> float:
    """Median microseconds per call with L2 flushed before each call.

    `fn` is captured once in a CUDA graph and replayed, so host overhead (which differs a lot
    between providers, and which the GPU would wait for if it exceeded the flush) is not timed.
    """
    global _FLUSH
    if _FLUSH is None:
        _FLUSH = torch.empty(256 * 1024 * 1024, dtype=torch.int8, device="cuda")  # > 4x L2
    graph = _capture(fn, 1)
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    for start, end in zip(starts, ends, strict=True):
        _FLUSH.zero_()
        start.record()
        graph.replay()
        end.record()
    torch.cuda.synchronize()
    return statistics.median(s.elapsed_time(e) * 1e3 for s, e in zip(starts, ends, strict=True))


def time_eager(fn: Callable[[], object], device: torch.device, reps: int = 20) -> float:
    """Median microseconds per eager call (includes the host syncs the call itself makes). On the
    CPU, where only --dry-run times (interpreted kernels: the numbers mean nothing), one rep:
    the loop still runs, in 2 calls instead of 21."""
    if device.type == "cpu":
        reps = 1
    fn()
    times = []
    for _ in range(reps):
        if device.type == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize()
        times.append((time.perf_counter() - start) * 1e6)
    return statistics.median(times)


def copy_gbps(gib: float, device: torch.device | None = None) -> float:
    """Device copy bandwidth (GB/s, read + write) of an eager `copy_` of `gib` GiB, after warm-up:
    the denominator of the kernel benchmarks' % of copy. On the CPU (a --dry-run) it runs the
    same copies timed by the host clock: the figure means nothing there."""
    device = torch.device("cuda") if device is None else device
    src = torch.empty(int(gib * 2**30), dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    for _ in range(3):
        dst.copy_(src)
    reps = 10
    if device.type != "cuda":
        start = time.perf_counter()
        for _ in range(reps):
            dst.copy_(src)
        return 2 * src.numel() * reps / (time.perf_counter() - start) / 1e9
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(reps):
        dst.copy_(src)
    end.record()
    end.synchronize()
    seconds = start.elapsed_time(end) / 1e3 / reps
    return 2 * src.numel() / seconds / 1e9


def write_csv(path: str | None, rows: list[dict[str, object]]) -> None:
    """(Re)write all rows so far, so an interrupted run keeps what it measured: whole, so that
    an interruption during the write does not lose the rows written before."""
    if not path or not rows:
        return
    keys = list(dict.fromkeys(k for r in rows for k in r))
    with replaced_whole(path, newline="") as f:
        writer = DictWriter(f, fieldnames=keys)
        writer.writeheader()
        writer.writerows(rows)


def _copy_gib(text: str) -> float:
    gib = float(text)
    if not 1 <= gib < math.inf:  # NaN included
        # A smaller copy is partly served from L2: not the HBM bandwidth the % of copy means.
        raise argparse.ArgumentTypeError(
            f"must be >= 1 and finite, so that the copy is not served from L2: {gib:g}"
        )
    return gib


def add_common_args(
    parser: argparse.ArgumentParser,
    *,
    dry_run: str,
    csv: str = "write the rows to this CSV file (after each row)",
) -> None:
    """--copy-gib (2 by default, >= 1), --csv and --dry-run, with `csv` and `dry_run` as their
    help."""
    parser.add_argument(
        "--copy-gib", type=_copy_gib, default=2.0,
        help="GiB of the eager copy_ that %% of copy is against (>= 1)",
    )  # fmt: skip
    parser.add_argument("--csv", type=output_file, help=csv)
    parser.add_argument("--dry-run", action="store_true", help=dry_run)


def note_dry_run_ignores(
    parser: argparse.ArgumentParser,
    args: argparse.Namespace,
    *,
    used: tuple[str, ...] = (),
    ignored: tuple[str, ...] | None = None,
) -> None:
    """Say on stderr which flags given with --dry-run (a value other than the default) the dry
    run does not read: the dests in `ignored`, or else every dest but `used` (a `--shapes
    lm_head --dry-run` ran the tiny shape, and a `--csv` was not written, without a word)."""
    notes = [
        f"{flag} {getattr(args, dest)!r}"
        for dest, flag in given_flags(parser, args).items()
        if (dest in ignored if ignored is not None else dest not in (*used, "dry_run"))
    ]
    if notes:
        print(f"--dry-run ignores the given {', '.join(notes)}", file=sys.stderr)


def require_gpu(
    parser: argparse.ArgumentParser, *, gpu: str = "CUDA GPU", dry_run: bool = True
) -> None:
    """A usage error (exit 2) where torch sees no GPU: "this benchmark needs a `gpu`", with
    " (or --dry-run)" where the script has one."""
    if not torch.cuda.is_available():
        parser.error(f"this benchmark needs a {gpu}" + (" (or --dry-run)" if dry_run else ""))


def print_copy_gbps(gib: float, suffix: str = "") -> float:
    """`copy_gbps(gib)`, printed after the device's name (then `suffix`) and returned."""
    copy = copy_gbps(gib)
    print(f"{torch.cuda.get_device_name(0)}: copy {copy:.0f} GB/s (read + write){suffix}")
    return copy


def round_like_the_gpu_if_interpreting() -> None:
    """For a dry run under ``TRITON_INTERPRET=1``: make Triton's interpreter round fp32 -> fp8 /
    bf16 as the GPU does (vllm/triton_utils/interpreter_rounding.py), so the dry run's checks
    judge the kernel, not the interpreter's casts (a bit-for-bit check fails otherwise)."""
    if os.environ.get("TRITON_INTERPRET") == "1":
        # Imported here: it needs Triton, which this module does not.
        from vllm.triton_utils import interpreter_rounding

        interpreter_rounding.install()
