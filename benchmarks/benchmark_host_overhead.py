"""Host time of a decode step: `engine.step()` of the built-in tiny model with the forward replaced
by a no-op CUDA-graph "replay" whose output is fixed logits, so what is timed is everything but
the forward: scheduling, building and uploading the step's inputs and metadata, sampling (greedy
argmax of the fixed logits), reading the sampled ids back and output processing. Requests are
final-output-only, as `LLM.generate` makes them; `--stream` builds every step's outputs instead, as
for the API server's streamed requests.

One at a time (`--no-async-scheduling` in the engine) a decode step costs its forward plus this
host time, so the numbers here are what `benchmark_latency.py`'s step ms minus forward ms should
then come to. The engine here runs with asynchronous scheduling (on by default for CUDA, and on
here on the CPU too): the next step's host time overlaps this step's forward and only shows where
it is the longer. Runs on the CPU as well as on a GPU (`--device cuda`); prompts are prefilled
through the same stub.

    python benchmarks/benchmark_host_overhead.py --batch-sizes 1 64 256
    python benchmarks/benchmark_host_overhead.py --device cuda --batch-sizes 1 64 256

`--tp-worker` also times what tensor parallelism adds to each step: on rank 0, encoding the step
message (`StepEncoder`) and pickling it as the executor's pipe does; on a worker, what it does
before its replay: unpickling and decoding the message and the worker's `ModelRunner.execute`,
run by a second runner that shares rank 0's stub model but has its own metadata builder (its
no-op replay included). Every step of the run, prefill included, goes through the replica in
order, so its state is a worker's. The pickled size of the decode steps' message is printed too.
"""

import argparse
import copy
import cProfile
import json
import math
import pickle
import pstats
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
from bench_utils import is_decode_only, synchronize, timed_step

from vllm.engine.arg_utils import EngineArgs
from vllm.model_executor.model_loader.builtin import resolve_model
from vllm.sampling_params import RequestOutputKind, SamplingParams
from vllm.utils.cli import run_main
from vllm.v1.engine.llm_engine import LLMEngine
from vllm.v1.executor.step_message import StepDecoder, StepEncoder
from vllm.v1.worker.model_runner import ModelRunner, StepInput


class _StubModel:
    """Stands in for the model: fixed logits for every row, no compute."""

    def __init__(self, logits: torch.Tensor) -> None:
        self.logits = logits

    def __call__(self, input_ids: torch.Tensor, metadata: object) -> torch.Tensor:
        return input_ids

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.logits[: hidden.shape[0]]


class _NoReplay:
    def replay(self) -> None:
        pass


def stub_forward(engine: LLMEngine, batch: int) -> None:
    """Replace rank 0's model by `_StubModel` and give it a no-op graph of `batch` rows, so that
    decode steps take the runner's graph path (padding rule, persistent buffers) as on a GPU."""
    runner = engine.executor.runner
    vocab = engine.config.model_config.vocab_size
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(runner.max_num_tokens, vocab, generator=gen).to(runner.device)
    runner.model = _StubModel(logits)
    runner.graphs = {batch: (_NoReplay(), logits[:batch])}


class WorkerReplica:
    """Rank 1's host side of every step, run in this process after rank 0's: the executor's
    `collective_rpc` is wrapped so that each `execute` step is encoded and pickled as the executor
    does for its pipes, then unpickled, decoded and executed by a copy of rank 0's (stubbed) runner
    with a builder of its own, as rank 1. Both times are kept apart from rank 0's step, which
    `timed_step` times as usual (a TP = 1 engine: no workers). A step launched ahead carries no
    ids: a copy of rank 0's sampled ids into the replica's receive buffer stands in for the
    broadcast (untimed: on a GPU it is a device-side transfer)."""

    def __init__(self, engine: LLMEngine) -> None:
        runner = engine.executor.runner
        b = runner.builder
        self.rank0 = runner
        self.runner: ModelRunner = copy.copy(runner)
        self.runner.rank = 1
        self.runner.received_ids = torch.empty(b.max_num_seqs, dtype=torch.int64, device=b.device)
        self.runner.builder = type(b)(
            b.max_num_tokens, b.max_num_seqs, b.max_blocks_per_seq, b.block_size, b.num_blocks,
            b.num_kda_slots, b.device,
        )  # fmt: skip
        self.runner.input_ids = self.runner.builder.input_ids
        self.encoder, self.decoder = StepEncoder(), StepDecoder()
        self.send_times: list[float] = []
        self.times: list[float] = []
        self.message_bytes = 0
        rank0_rpc = engine.executor.collective_rpc

        def collective_rpc(method: str, *args: object) -> object:
            result = rank0_rpc(method, *args)
            if method == "execute":
                self._execute(*args)
            return result

        engine.executor.collective_rpc = collective_rpc

    def _execute(self, step: StepInput) -> None:
        if step.input_ids is None:
            last = self.rank0.last_sampled
            self.runner.received_ids[: len(last)].copy_(last)
        start = time.perf_counter()
        message = pickle.dumps(("execute", self.encoder.encode(step)), pickle.HIGHEST_PROTOCOL)
        sent = time.perf_counter()
        _, received = pickle.loads(message)
        self.runner.execute(self.decoder.decode(received))
        self.send_times.append(sent - start)
        self.times.append(time.perf_counter() - sent)
        self.message_bytes = len(message)


def tiny_model(folder: Path, max_len: int) -> str:
    """The tiny model, or a copy of it in `folder` whose `max_position_embeddings` is `max_len`
    when its own is too short (its MLA layers use no positional encoding, and the dummy weights
    do not depend on it)."""
    builtin, _ = resolve_model("kimi-k3-tiny")
    config = json.loads((builtin / "config.json").read_text())
    if max_len <= config["text_config"]["max_position_embeddings"]:
        return "kimi-k3-tiny"
    shutil.copytree(builtin, folder)
    config["text_config"]["max_position_embeddings"] = max_len
    (folder / "config.json").write_text(json.dumps(config))
    return str(folder)


def run_case(
    device: str, batch: int, input_len: int, steps: int, warmup: int, profile: bool, stream: bool,
    tmp: Path, tp_worker: bool = False,
):  # fmt: skip
    """The seconds of each of `steps` decode steps of `batch` sequences; with `tp_worker` also
    the median seconds of rank 0's encoding and of the worker replica, and the step message's
    bytes (else None)."""
    budget = max(8192, batch)
    # Sequences prefilled early decode while the others prefill (one token per step).
    max_tokens = math.ceil(batch * input_len / (budget - batch)) + warmup + steps + 2
    max_len = input_len + max_tokens + 1
    model = tiny_model(tmp / "tiny", max_len)
    ea = EngineArgs(
        model=model, load_format="dummy", skip_tokenizer_init=True, device=device,
        enforce_eager=True, max_num_seqs=batch, max_model_len=max_len,
        max_num_batched_tokens=budget, block_size=16,
        num_gpu_blocks_override=batch * math.ceil(max_len / 16) + 1,
        async_scheduling=True,
    )  # fmt: skip
    engine = LLMEngine.from_engine_args(ea)
    try:
        stub_forward(engine, batch)
        worker = WorkerReplica(engine) if tp_worker else None
        kind = RequestOutputKind.CUMULATIVE if stream else RequestOutputKind.FINAL_ONLY
        params = SamplingParams(
            temperature=0.0, max_tokens=max_tokens, ignore_eos=True, output_kind=kind
        )
        vocab = engine.config.model_config.vocab_size
        for i in range(batch):
            engine.add_request(f"r{i}", [(i + j) % vocab for j in range(input_len)], params)
        while not is_decode_only(engine):
            engine.step()
        for _ in range(warmup):
            engine.step()
        dev = torch.device(device)
        profiler = cProfile.Profile() if profile else None
        if profiler is not None:
            profiler.enable()
        times = [timed_step(engine) for _ in range(steps)]
        if profiler is not None:
            profiler.disable()
            print(f"\nB={batch}: cProfile of {steps} decode steps (top 30 by own time)")
            pstats.Stats(profiler).sort_stats("tottime").print_stats(30)
        if len(engine.scheduler.running) != batch:
            raise RuntimeError("a sequence finished early: the timed steps were not all decodes")
        synchronize(dev)
        if worker is None:
            return times, None
        send = statistics.median(worker.send_times[-steps:])
        receive = statistics.median(worker.times[-steps:])
        return times, (send, receive, worker.message_bytes)
    finally:
        engine.shutdown()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--batch-sizes", type=int, nargs="+", default=[1, 64, 256],
        help="decode batch sizes, one engine each (default: 1 64 256)",
    )  # fmt: skip
    parser.add_argument("--input-len", type=int, default=1024, help="prompt tokens")
    parser.add_argument(
        "--steps",
        type=int,
        default=50,
        help="decode steps timed per batch (the p99.9 column is the max below 1000)",
    )
    parser.add_argument(
        "--warmup-steps", type=int, default=5, help="untimed decode steps before the timed ones"
    )
    parser.add_argument(
        "--device", choices=["cpu", "cuda"], default="cpu",
        help="device the engine runs on (default: cpu; the forward is stubbed on either)",
    )  # fmt: skip
    parser.add_argument("--profile", action="store_true", help="cProfile the timed steps")
    parser.add_argument(
        "--stream", action="store_true", help="every step returns the outputs (API streaming)"
    )
    parser.add_argument(
        "--tp-worker",
        action="store_true",
        help="also time a tensor-parallel worker's host work per step (see above)",
    )
    args = parser.parse_args(argv)
    if min(args.batch_sizes + [args.input_len, args.steps]) < 1:
        parser.error("batch sizes, --input-len and --steps must be positive")
    if args.warmup_steps < 0:
        parser.error(f"argument --warmup-steps: must be >= 0, got {args.warmup_steps}")
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("argument --device: torch sees no GPU")
    # One thread: on a shared CPU, torch's worker threads make the small CPU ops jitter.
    torch.set_num_threads(1)
    # The fastest step: the least disturbed by other processes on a shared CPU.
    worker_columns = f"  {'send ms':>7}  {'worker ms':>9}  {'message KB':>10}"
    worker_columns = worker_columns if args.tp_worker else ""
    # The slowest steps: where collections of the garbage collector and other pauses land.
    print(
        f"{'batch':>5}  {'median ms':>9}  {'min ms':>8}  {'p99.9 ms':>8}  {'max ms':>8}"
        f"  {'median us/request':>17}{worker_columns}"
    )
    for batch in args.batch_sizes:
        start = time.perf_counter()
        with tempfile.TemporaryDirectory() as tmp:
            times, worker = run_case(
                args.device, batch, args.input_len, args.steps, args.warmup_steps, args.profile,
                args.stream, Path(tmp), args.tp_worker,
            )  # fmt: skip
        worker_cells = ""
        if worker is not None:
            send, receive, size = worker
            worker_cells = f"  {1e3 * send:>7.3f}  {1e3 * receive:>9.3f}  {size / 1e3:>10.1f}"
        median, ordered = statistics.median(times), sorted(times)
        tail = ordered[min(len(ordered) - 1, math.ceil(0.999 * len(ordered)) - 1)]
        print(
            f"{batch:>5}  {1e3 * median:>9.3f}  {1e3 * ordered[0]:>8.3f}  {1e3 * tail:>8.3f}"
            f"  {1e3 * ordered[-1]:>8.3f}  {1e6 * median / batch:>17.1f}{worker_cells}"
            f"  ({time.perf_counter() - start:.0f} s with start-up and prefill)",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    sys.exit(run_main(main))
