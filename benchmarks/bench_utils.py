"""Shared pieces of the engine benchmarks (`benchmark_latency.py`, `benchmark_throughput.py`): the
command line (every `EngineArgs` flag, `-tp`, `--output-json`, `--dry-run`), the two ceilings
measured in the same run, cache sizing for a workload, prompts, step timing and the JSON record.

Ceilings, measured before the engine is built so that their buffers never compete with the model:
- copy bandwidth: an eager `copy_` of >= 1 GiB after a warm-up, (bytes read + written) / median
  time. Eager on purpose: a `copy_` captured in a CUDA graph timed ~2.7 TB/s on the H200 against
  4.2-4.3 TB/s eager (issue 12), and would understate the floor's bandwidth;
- bf16 GEMM peak: `torch.matmul` of two random n x n bf16 matrices (n = 8192 by default),
  2 n^3 / median time.
"""

import argparse
import contextlib
import dataclasses
import datetime
import importlib.metadata
import math
import platform
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any

import torch

from vllm.config.vllm import VllmConfig
from vllm.engine.arg_utils import EngineArgs, each_refusal, refusal, usage_error
from vllm.model_executor.layers.fused_moe.layer import FusedMoE
from vllm.model_executor.model_loader.loader import build_model
from vllm.sampling_params import RequestOutputKind, SamplingParams
from vllm.transformers_utils.configs import load_model_config
from vllm.utils import cli
from vllm.utils.cli import FlexibleArgumentParser, given_flags, output_file
from vllm.v1.core.kv_cache_utils import cache_bytes
from vllm.v1.engine.llm_engine import LLMEngine
from vllm.v1.worker.warm_up_bands import warm_up_bands

DRY_RUN_MODEL = "kimi-k3-tiny"
# EngineArgs fields that an engine benchmark sizes for its workload unless given (the default
# `sized` of make_parser).
SIZED = ("max_num_seqs", "max_model_len", "kv_cache_memory")


def make_parser(doc: str, sized: tuple[str, ...] = SIZED) -> FlexibleArgumentParser:
    """Every `EngineArgs` flag (as `vllm serve` has them), `-tp`, `--output-json` and `--dry-run`.
    `--max-num-seqs` and `--max-model-len` default to None: the benchmark sizes them."""
    parser = FlexibleArgumentParser(
        description=doc, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    engine = parser.add_argument_group("engine (EngineArgs: the same fields as LLM(...) keywords)")
    EngineArgs.add_cli_args(engine)
    parser.set_defaults(max_num_seqs=None)
    # The engine's defaults that the benchmarks replace by sizes for their workload (--help
    # showed the engine's `(default: 256)`).
    for action in engine._group_actions:
        if action.dest in sized:
            text = action.help.split(" (default:")[0]
            action.help = f"{text} (default: sized for the workload, see above)"
    bench = parser.add_argument_group("benchmark")
    bench.add_argument(
        "--output-json", type=output_file,
        help="write the results to this JSON file (after each case)",
    )  # fmt: skip
    bench.add_argument(
        "--dry-run",
        action="store_true",
        help=f"run the whole script on the CPU on {DRY_RUN_MODEL} at tiny sizes (replacing the "
        "model, device and sizes; given flags it replaces are named): checks the script, measures "
        "nothing useful",
    )
    return parser


def apply_dry_run(
    parser: argparse.ArgumentParser, args: argparse.Namespace, quiet: bool = False, **values: Any
) -> None:
    """Set `--dry-run`'s `values` in `args` and say on stderr (unless `quiet`: a child process
    of a run that said it) which flags given on the command line they replace (a given flag
    differing from both its default and the dry run's value): a `--batch-sizes 4 --dry-run` ran
    batches 1 and 2 without a word."""
    given = given_flags(parser, args)
    notes = [
        f"{given[dest]} {getattr(args, dest)!r} by {value!r}"
        for dest, value in values.items()
        if dest in given and getattr(args, dest) != value
    ]
    for dest, value in values.items():
        setattr(args, dest, value)
    if notes and not quiet:
        print(f"--dry-run replaces {', '.join(notes)}", file=sys.stderr)


def check_args(parser: argparse.ArgumentParser, args: argparse.Namespace) -> torch.device:
    """The device the benchmark runs on; parser errors for flags that cannot work (an
    `--output-json` that cannot be written is one already when the flags are parsed)."""
    if args.dry_run:
        return torch.device("cpu")
    if args.device == "cpu" or not torch.cuda.is_available():
        parser.error("this benchmark measures a GPU: run it on one, or use --dry-run on the CPU")
    return torch.device("cuda")


def engine_config(
    parser: argparse.ArgumentParser,
    ea: EngineArgs,
    needed: int,
    workload: str,
    flags: dict[str, str] | None = None,
) -> VllmConfig:
    """`ea`'s checked config, whose max_model_len holds `needed` tokens (prompt + decode steps of
    `workload`, e.g. "--input-len + --output-len"); a parser error naming the flag otherwise (an
    explicit `--max-model-len` too small or `auto` above the model's limit included). `flags`:
    the script's own flags that set an engine flag (`{"--tensor-parallel-size": "--tp-sizes"}`),
    named in its refusals instead.

    Built once per run and passed on (`size_cache`, `LLMEngine(config)`): each build checks
    the arguments again, and logs their warnings (`--enable-prefix-caching`) again."""
    try:
        config = ea.create_engine_config()
    except ValueError as e:
        refused = [
            f"{workload}: {needed} tokens per sequence; {error}"
            if ea.max_model_len == needed and "max_position_embeddings" in str(error)
            else _renamed(refusal(error), flags or {})
            for error in each_refusal(e)
        ]
        usage_error(parser, refused)
    if config.model_config.max_model_len < needed:
        parser.error(
            f"argument --max-model-len: {config.model_config.max_model_len} is too small, "
            f"{workload} need {needed} tokens per sequence"
        )
    return config


def _renamed(refused: str, flags: dict[str, str]) -> str:
    for flag, own in flags.items():
        if refused.startswith(f"argument {flag}: "):
            return f"argument {own}: " + refused.removeprefix(f"argument {flag}: ")
    return refused


def engine_args(args: argparse.Namespace, **overrides: Any) -> EngineArgs:
    """`EngineArgs` from the parsed flags, with `overrides` for the fields the benchmark sizes."""
    return dataclasses.replace(EngineArgs.from_cli_args(args), **overrides)


def size_cache(config: VllmConfig, num_seqs: int, tokens_per_seq: int) -> None:
    """Give `config` exactly the caches its engine needs to run `num_seqs` sequences of
    `tokens_per_seq` tokens, unless its cache arguments were given: a KDA slot per schedulable
    sequence (the engine reserves max_num_seqs of them) and the MLA blocks, plus the reserved
    dummy slot and block, counted on a meta-device build of the model in the engine's dtype (TP=1
    shapes: at TP > 1 a rank's KDA slots are smaller and the surplus becomes MLA blocks). Set as
    `kv_cache_memory`, it replaces the start-up profiling run."""
    cc, mc = config.cache_config, config.model_config
    if cc.kv_cache_memory is not None or cc.num_gpu_blocks_override is not None:
        return
    model = build_model(load_model_config(mc.folder), mc.dtype, device="meta")
    block_bytes, slot_bytes = cache_bytes(model.get_kv_cache_spec(), cc.block_size)
    blocks = num_seqs * math.ceil(tokens_per_seq / cc.block_size) + 1
    slots = config.scheduler_config.max_num_seqs + 1
    cc.kv_cache_memory = slots * slot_bytes + blocks * block_bytes


def engine_summary(engine: LLMEngine) -> dict[str, Any]:
    """The engine configuration the run measured (the sizes the benchmark chose included)."""
    config = engine.config
    return {
        "max_num_seqs": config.scheduler_config.max_num_seqs,
        "max_model_len": config.scheduler_config.max_model_len,
        "max_num_batched_tokens": config.scheduler_config.max_num_batched_tokens,
        "kv_cache_memory": config.cache_config.kv_cache_memory,
        "num_blocks": config.cache_config.num_blocks,
        "num_kda_slots": config.cache_config.num_kda_slots,
        "cudagraph_capture_sizes": config.compilation_config.cudagraph_capture_sizes,
        "tensor_parallel_size": config.parallel_config.tensor_parallel_size,
        "dtype": str(config.model_config.dtype),
        "quantization_config": config.model_config.quantization_config,
    }


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def median_seconds(fn: Callable[[], object], device: torch.device, reps: int) -> float:
    """Median seconds of `reps` calls of `fn` after three warm-up calls (CUDA events on a GPU)."""
    for _ in range(3):
        fn()
    synchronize(device)
    if device.type != "cuda":
        times = []
        for _ in range(reps):
            start = time.perf_counter()
            fn()
            times.append(time.perf_counter() - start)
        return statistics.median(times)
    events = [
        (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
        for _ in range(reps)
    ]
    for start, end in events:
        start.record()
        fn()
        end.record()
    synchronize(device)
    return statistics.median(start.elapsed_time(end) / 1e3 for start, end in events)


def copy_gbps(gib: float, device: torch.device) -> float:
    """GB/s (read + write) of an eager `copy_` of `gib` GiB of bf16, median of 20 after warm-up."""
    src = torch.randn(int(gib * 2**30) // 2, device=device, dtype=torch.bfloat16)
    dst = torch.empty_like(src)
    seconds = median_seconds(lambda: dst.copy_(src), device, reps=20)
    return 2 * src.numel() * src.element_size() / seconds / 1e9


def matmul_tflops(n: int, device: torch.device) -> float:
    """TFLOP/s of `torch.matmul` of two random n x n bf16 matrices, median of 20 after warm-up."""
    a = torch.randn(n, n, device=device, dtype=torch.bfloat16)
    b = torch.randn(n, n, device=device, dtype=torch.bfloat16)
    return 2 * n**3 / median_seconds(lambda: torch.matmul(a, b), device, reps=20) / 1e12


def measure_ceilings(device: torch.device, copy_gib: float, matmul_n: int) -> dict[str, float]:
    """Both ceilings on `device`; their buffers are freed before returning."""
    ceilings = {
        "copy_gib": copy_gib,
        "copy_gbps": copy_gbps(copy_gib, device),
        "matmul_n": matmul_n,
        "matmul_bf16_tflops": matmul_tflops(matmul_n, device),
    }
    if device.type == "cuda":
        torch.cuda.empty_cache()  # give the engine every byte back
    return ceilings


def environment(device: torch.device) -> dict[str, Any]:
    """Device, versions and date of the run (for docs/performance.md)."""

    def version(package: str) -> str | None:
        try:
            return importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            return None

    return {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "gpus": torch.cuda.device_count() if device.type == "cuda" else 0,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "triton": version("triton"),
        "fla-core": version("fla-core"),
        "python": platform.python_version(),
    }


def random_prompts(count: int, length: int, vocab_size: int, seed: int) -> list[list[int]]:
    """`count` prompts of `length` token ids drawn uniformly from the vocabulary."""
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab_size, (count, length), generator=gen).tolist()


def greedy(max_tokens: int) -> SamplingParams:
    """Greedy sampling of exactly `max_tokens` tokens (no eos stop), final output only (as
    `LLM.generate`: the steps' outputs are not read)."""
    return SamplingParams(
        temperature=0.0, max_tokens=max_tokens, ignore_eos=True,
        output_kind=RequestOutputKind.FINAL_ONLY,
    )  # fmt: skip


def run_warm_up_bands(engine: LLMEngine, length: int, seed: int) -> None:
    """Run the steps of `warm_up_bands` (vllm/v1/worker/warm_up_bands.py) for prompts of up to
    `length` tokens, each as requests of two tokens run to completion, up to the largest prefill
    one step can hold: the step budget, or max_num_seqs prompts of `length` tokens (the scheduler
    admits no more sequences, so a larger warm-up step would run as many small ones)."""
    sc = engine.config.scheduler_config
    budget = min(sc.max_num_batched_tokens, sc.max_num_seqs * length)
    vocab = engine.config.model_config.vocab_size
    for step, lengths in enumerate(warm_up_bands(length, budget)):
        for i, n in enumerate(lengths):
            prompt = random_prompts(1, n, vocab, seed + i)[0]
            engine.add_request(f"warmup-{length}-step{step}-{i}", prompt, greedy(2))
        while engine.has_unfinished_requests():
            engine.step()


def is_decode_only(engine: LLMEngine) -> bool:
    """Whether the next step can only be decodes: nothing waits and every running sequence has
    its prompt in the cache."""
    sched = engine.scheduler
    return sched.num_waiting == 0 and all(
        r.num_computed_tokens >= len(r.prompt_token_ids) for r in sched.running
    )


def timed_step(engine: LLMEngine) -> float:
    """Wall seconds of one `engine.step()` as its caller sees it: a step returns once its tokens
    are on the host, so nothing needs synchronizing; with asynchronous scheduling, the time it
    waits for its step (launched by the call before) while the next one is already launched."""
    start = time.perf_counter()
    engine.step()
    return time.perf_counter() - start


class ForwardTimer:
    """Times rank 0's model forward of each step on the device: CUDA events around the runner's
    `execute` (metadata upload + graph replay or eager forward), host clock on the CPU. The
    wrapper is an instance attribute that `close` removes, so the engine is left as found."""

    def __init__(self, engine: LLMEngine, device: torch.device) -> None:
        self.runner = engine.executor.runner
        self.device = device
        self._execute = self.runner.execute
        self._marks: list[tuple[Any, Any]] = []
        self.runner.execute = self._timed

    def _timed(self, step: Any) -> torch.Tensor:
        if self.device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            out = self._execute(step)
            end.record()
        else:
            start = time.perf_counter()
            out = self._execute(step)
            end = time.perf_counter()
        self._marks.append((start, end))
        return out

    def close(self) -> list[float]:
        """Stop timing; seconds of each forward since construction."""
        del self.runner.execute
        synchronize(self.device)
        if self.device.type == "cuda":
            return [start.elapsed_time(end) / 1e3 for start, end in self._marks]
        return [end - start for start, end in self._marks]


@contextlib.contextmanager
def synchronous_steps(engine: LLMEngine) -> Iterator[None]:
    """Steps inside run one at a time, each launched after the last one's tokens are back
    (asynchronous scheduling off; restored on exit). A step already launched ahead is completed
    first, its outputs dropped."""
    previous = engine.async_scheduling
    engine.async_scheduling = False
    try:
        if engine.step_in_flight:
            engine.step()
        yield
    finally:
        engine.async_scheduling = previous


@contextlib.contextmanager
def graphs_set_aside(engine: LLMEngine) -> Iterator[None]:
    """Steps inside run eagerly on rank 0 (its runner's CUDA graphs are put back on exit)."""
    runner = engine.executor.runner
    graphs, runner.graphs = runner.graphs, {}
    try:
        yield
    finally:
        runner.graphs = graphs


def distinct_experts_of_one_step(engine: LLMEngine) -> list[int]:
    """Run one engine step eagerly and return, per MoE layer, how many distinct experts its
    router chose (forward hooks on rank 0's `FusedMoE` modules). Hooks do not run inside a CUDA
    graph replay, so the runner's graphs are set aside for this step."""
    runner = engine.executor.runner
    counts: list[int] = []

    def hook(module: FusedMoE, inputs: tuple, output: torch.Tensor) -> None:
        # inputs: (x, topk_weights, topk_ids); the last columns are fused shared experts, if any
        ids = inputs[2]
        routed = ids[:, : ids.shape[1] - module.num_fused_shared_experts]
        counts.append(int(routed.unique().numel()))

    moes = [m for m in runner.model.modules() if isinstance(m, FusedMoE)]
    handles = [m.register_forward_hook(hook) for m in moes]
    try:
        # Synchronous: a step launched ahead inside would be hooked too.
        with synchronous_steps(engine), graphs_set_aside(engine):
            engine.step()
    finally:
        for handle in handles:
            handle.remove()
    if len(counts) != len(moes):
        raise RuntimeError(f"{len(counts)} router calls in the step, expected {len(moes)}")
    return counts


def expected_distinct_experts(num_experts: int, top_k: int, tokens: int) -> float:
    """Distinct experts `tokens` tokens touch in expectation if each picks top_k uniformly."""
    return num_experts * (1 - (1 - top_k / num_experts) ** tokens)


def write_json(path: str | None, record: dict[str, Any]) -> None:
    """Write `record` to `path` (if given) through a temporary file, so that a run killed
    mid-write leaves the previous complete record."""
    if path:
        cli.write_json(path, record, indent=1, default=str)


def print_table(title: str, columns: list[tuple[str, str, str]], rows: list[dict]) -> None:
    """`columns`: (heading, record key, format spec); a missing value prints "-", a row with
    "skipped" prints its reason."""
    cells = [
        [
            "-" if row.get(k) is None else format(row[k], f)
            for _, k, f in (columns[:2] if "skipped" in row else columns)
        ]
        for row in rows
    ]
    widths = [max([len(h)] + [len(c[i]) for c in cells if i < len(c)]) for i, (h, _, _) in
              enumerate(columns)]  # fmt: skip
    print(f"\n{title}")
    print("  ".join(h.rjust(w) for (h, _, _), w in zip(columns, widths, strict=True)))
    for row, line in zip(rows, cells, strict=True):
        text = "  ".join(v.rjust(w) for v, w in zip(line, widths, strict=False))
        print(text + (f"  skipped: {row['skipped']}" if "skipped" in row else ""))
