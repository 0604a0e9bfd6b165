"""Probe (2 GPUs): where a TP = 2 decode step's time goes, seen from both ranks, with the host
taken out of the picture.

The one TP = 2 run (docs/performance.md, "TP = 2 on `nvidia-h200-x2`") found rank 0's graph
replay taking the whole step, 31-36 ms more than TP = 1 from batch 8 on: rank 0's device waits
inside the graph, either in all-reduces that are slow where captured (NCCL in a graph, next to
kernels launched with programmatic dependent launch), or for a rank 1 that starts late (its host
path: the step message, its builder, its launch). The engine's own profile (`benchmark_latency.py
--profile-steps`, tp2_a.sh) sees rank 0 only and cannot tell the two apart.

Here both ranks run the engine's `ModelRunner` (load, caches, warm-up, graph capture as the
engine does) and the same synthetic decode steps (batch B at context `--context`, distinct blocks
and KDA slots, random ids), but each step starts on both ranks at once: a host barrier on a gloo
side group, then `execute` (stage + replay), then a device sync. Per rank and batch it prints the
median host launch time, the device time of the step (CUDA events around `execute`), and a
profile of `--profile-steps` such steps grouped as the latency benchmark groups kernels (the
"TP collectives" group is the NCCL kernels; on one rank their time includes waiting for the
other). Then the same steps eagerly (graphs set aside on both ranks: NCCL not captured).

Reading it: a graph step near the TP = 1 step here (a few ms at batch 8, not ~45) means the
engine's extra time is rank 1 starting late (the host path); both ranks' device time near ~45 ms
with "TP collectives" small on one rank and large on the other means one rank's kernels are slow;
large on both, that the captured collectives are. Run it again with `VLLM_TRITON_PDL=0` to see
whether the PDL launches around the NCCL kernels matter.

    python tp2_rank_probe.py --model kimi-linear-48b-a3b --quantization-config '<PTPC>'
    python tp2_rank_probe.py --dry-run   # gloo on the CPU, kimi-linear-tiny, no graphs
"""

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

from step_profile import breakdown, profile_steps_and_gaps  # noqa: E402

from vllm.distributed import initialize_model_parallel  # noqa: E402
from vllm.engine.arg_utils import EngineArgs  # noqa: E402
from vllm.models.kimi_k3.amd.metadata import BatchSchedule  # noqa: E402
from vllm.v1.worker.model_runner import ModelRunner, StepInput  # noqa: E402


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class Steps:
    """Decode steps of `batch` sequences, one token further each time: sequence i holds KDA slot
    i + 1 and blocks `1 + i * per_seq ...` (its table long enough for every step)."""

    def __init__(self, batch: int, context: int, per_seq: int, vocab: int, seed: int) -> None:
        self.batch, self.context = batch, context
        self.tables = [list(range(1 + i * per_seq, 1 + (i + 1) * per_seq)) for i in range(batch)]
        self.gen = torch.Generator().manual_seed(seed)
        self.vocab = vocab

    def next(self) -> StepInput:
        ids = torch.randint(self.vocab, (self.batch,), generator=self.gen).tolist()
        schedule = BatchSchedule(
            [self.context] * self.batch, [1] * self.batch, self.tables,
            list(range(1, self.batch + 1)), self.batch,
        )  # fmt: skip
        self.context += 1
        return StepInput(ids, schedule, list(range(self.batch)))


def _timed_steps(runner: ModelRunner, steps: Steps, count: int, side) -> dict[str, float]:
    """`count` steps, each started on every rank at once; median host and device ms."""
    device = runner.device
    host, dev = [], []
    for _ in range(count):
        step = steps.next()
        _sync(device)
        dist.barrier(group=side)
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
        t0 = time.perf_counter()
        runner.execute(step)
        host.append(1e3 * (time.perf_counter() - t0))
        if device.type == "cuda":
            end.record()
            end.synchronize()
            dev.append(start.elapsed_time(end))
        else:
            dev.append(host[-1])
    return {"host_launch_ms": statistics.median(host), "device_ms": statistics.median(dev)}


def _profiled(runner: ModelRunner, steps: Steps, count: int, side) -> list[dict]:
    def step() -> None:
        _sync(runner.device)
        dist.barrier(group=side)
        runner.execute(steps.next())

    kernels, _ = profile_steps_and_gaps(step, count, runner.device)
    total = sum(k.us_per_step for k in kernels)
    groups = breakdown(kernels, total, {}, 1.0)
    return [{"group": g["group"], "us_per_step": round(g["us_per_step"], 1)} for g in groups]


def _worker(rank: int, world: int, port: int, args: argparse.Namespace, results) -> None:
    dry = args.dry_run
    if dry:
        torch.set_num_threads(1)
    store = dist.TCPStore("127.0.0.1", port, world, is_master=False)
    dist.init_process_group("gloo" if dry else "nccl", store=store, rank=rank, world_size=world)
    side = dist.new_group(backend="gloo")  # host barriers, outside the NCCL stream
    initialize_model_parallel(world)
    config = EngineArgs(
        model=args.model, load_format=args.load_format, skip_tokenizer_init=True,
        quantization_config=args.quantization_config, tensor_parallel_size=world,
        max_num_seqs=max(args.batch_sizes), max_model_len=args.context + 4 * args.steps + 64,
        device="cpu" if dry else "auto",
    ).create_engine_config()  # fmt: skip
    if config.compilation_config.cudagraph_capture_sizes:
        # The probed sizes only (the engine captures every batch class): capture and Triton's
        # compiles then fit one call.
        config.compilation_config.cudagraph_capture_sizes = sorted(args.batch_sizes)
    runner = ModelRunner(config, rank)
    start = time.perf_counter()
    runner.load_model()
    block_size = config.cache_config.block_size
    per_seq = -(-config.model_config.max_model_len // block_size)
    runner.initialize_cache(max(args.batch_sizes) * per_seq + 1, max(args.batch_sizes) + 1)
    capture_s = runner.capture_cudagraphs()
    ready_s = time.perf_counter() - start
    out = {"ready_s": ready_s, "capture_s": capture_s, "cases": []}
    graphs = dict(runner.graphs)
    for mode in ("graph", "eager") if graphs else ("eager",):
        runner.graphs = graphs if mode == "graph" else {}
        for batch in sorted(args.batch_sizes):
            steps = Steps(batch, args.context, per_seq, runner.vocab_size, args.seed + batch)
            _timed_steps(runner, steps, 2, side)  # warm-up (eager: the first launches)
            case = {"mode": mode, "batch": batch}
            case |= _timed_steps(runner, steps, args.steps, side)
            if args.profile_steps:
                case["profile"] = _profiled(runner, steps, args.profile_steps, side)
            out["cases"].append(case)
    results[rank] = out
    dist.destroy_process_group()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", default="kimi-linear-48b-a3b")
    parser.add_argument("--load-format", default="dummy")
    parser.add_argument("--quantization-config", default=None, help="JSON, as the engine's")
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 8, 64])
    parser.add_argument("--context", type=int, default=1024, help="cached tokens a sequence")
    parser.add_argument("--steps", type=int, default=20, help="timed steps per case")
    parser.add_argument("--profile-steps", type=int, default=2, help="profiled steps per case")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--output-json", default=None)
    parser.add_argument("--dry-run", action="store_true", help="gloo, CPU, kimi-linear-tiny")
    args = parser.parse_args(argv)
    if args.dry_run:
        args.model, args.load_format, args.batch_sizes = "kimi-linear-tiny", "auto", [1, 3]
        args.context, args.steps, args.profile_steps = 8, 2, 1
    elif torch.cuda.device_count() < 2:
        parser.error("needs 2 GPUs (or --dry-run)")
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")  # NVLink multicast stays off (KINDS.md)
    with mp.Manager() as manager:
        # After the Manager's process, which forks: the store runs a server thread.
        store = dist.TCPStore("127.0.0.1", 0, 2, is_master=True, wait_for_workers=False)
        results = manager.dict()
        mp.spawn(_worker, args=(2, store.port, args, results), nprocs=2, join=True)
        results = dict(results)
    for rank in (0, 1):
        r = results[rank]
        print(f"rank {rank}: ready in {r['ready_s']:.1f} s (capture {r['capture_s']:.1f} s)")
        for c in r["cases"]:
            print(
                f"rank {rank} {c['mode']:>5} B={c['batch']:>4}: device {c['device_ms']:.2f} ms, "
                f"host launch {c['host_launch_ms']:.2f} ms",
                flush=True,
            )
            for g in c.get("profile", []):
                print(f"    {g['us_per_step']:>10.1f} us  {g['group']}")
    if args.output_json:
        Path(args.output_json).write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
