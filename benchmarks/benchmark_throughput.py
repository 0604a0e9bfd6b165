"""Throughput of a Kimi model in the engine, measured as vLLM's benchmark_throughput does: add
`--num-prompts` prompts of `--input-len` random token ids at once, each generating exactly
`--output-len` tokens (eos ignored), and step the engine until all finish. Prints requests/s, total
tokens/s and output tokens/s, then how the time splits between steps that carry prefill tokens
(eager) and decode-only steps (CUDA-graph replays unless `--enforce-eager`): their count, seconds,
median step and mean batch.

vLLM's script name and main flags (`--model`, `--load-format dummy`, `--quantization-config`,
`--input-len`, `--output-len`, `--num-prompts`, `--enforce-eager`, `-tp`, `--output-json`) and
every other `EngineArgs` flag. A warm-up of as many requests as fill one prefill step (at least
two, 2 output tokens each), then steps in every 2048-token band of the step budget
(`bench_utils.run_warm_up_bands`), compiles and tunes the kernels first. The engine is sized for
the workload unless the flags say otherwise: `--max-num-seqs` = min(number of prompts, 256),
`--max-model-len` = input + output length, `--kv-cache-memory` = exactly the caches of that many
sequences of that length (no profiling run).

The decode floor against the copy bandwidth, per batch size and context, is
`benchmark_latency.py`'s job.

    python benchmarks/benchmark_throughput.py --dry-run
    python benchmarks/benchmark_throughput.py --model kimi-linear-48b-a3b --load-format dummy \\
        --skip-tokenizer-init --num-prompts 256 --input-len 1024 --output-len 128 \\
        --max-num-batched-tokens 8192 --output-json throughput.json
"""

import statistics
import sys
import time
from typing import Any

from bench_utils import (
    DRY_RUN_MODEL,
    apply_dry_run,
    check_args,
    engine_args,
    engine_config,
    engine_summary,
    environment,
    greedy,
    is_decode_only,
    make_parser,
    random_prompts,
    run_warm_up_bands,
    size_cache,
    synchronize,
    timed_step,
    write_json,
)

from vllm.utils.cli import positive_int, run_main
from vllm.v1.core.kv_cache_utils import CacheSizeError
from vllm.v1.engine.llm_engine import LLMEngine

# Default concurrency cap, as the engine's own max_num_seqs default.
MAX_NUM_SEQS = 256


def phase(steps: list[tuple[float, int]]) -> dict[str, Any]:
    """Count, seconds, median ms and mean batch of (seconds, sequences) steps."""
    if not steps:
        return {"steps": 0, "seconds": 0.0}
    seconds = [s for s, _ in steps]
    return {
        "steps": len(steps),
        "seconds": sum(seconds),
        "step_ms_median": 1e3 * statistics.median(seconds),
        "mean_batch": statistics.fmean(n for _, n in steps),
        "sequence_steps_per_s": sum(n for _, n in steps) / sum(seconds),
    }


def main(argv: list[str] | None = None) -> int:
    parser = make_parser(__doc__)
    work = parser.add_argument_group("workload")
    work.add_argument("--num-prompts", type=positive_int, default=256, help="prompts added at once")
    work.add_argument("--input-len", type=positive_int, default=1024, help="prompt tokens")
    work.add_argument(
        "--output-len", type=positive_int, default=128, help="tokens generated per prompt"
    )
    args = parser.parse_args(argv)
    device = check_args(parser, args)
    if args.dry_run:
        apply_dry_run(
            parser, args, model=DRY_RUN_MODEL, load_format="dummy", skip_tokenizer_init=True,
            tokenizer=None, device="cpu", dtype="auto", max_num_batched_tokens=16, num_prompts=3,
            input_len=12, output_len=3, max_num_seqs=2, max_model_len=None, kv_cache_memory=None,
            num_gpu_blocks_override=None,
        )  # fmt: skip
    # `is None`: an explicit 0 is refused by the engine's check, not replaced by the default.
    if args.max_num_seqs is None:
        seqs = min(args.num_prompts, MAX_NUM_SEQS)
    else:
        seqs = args.max_num_seqs
    needed = args.input_len + args.output_len
    max_model_len = needed if args.max_model_len is None else args.max_model_len
    ea = engine_args(args, max_num_seqs=seqs, max_model_len=max_model_len)
    config = engine_config(parser, ea, needed, "--input-len + --output-len")
    size_cache(config, seqs, needed)

    record: dict[str, Any] = {"benchmark": "throughput", "environment": environment(device)}
    record["args"] = vars(args)
    start = time.perf_counter()
    try:
        engine = LLMEngine(config)
    except CacheSizeError as e:  # --num-gpu-blocks-override / --kv-cache-memory too small
        parser.error(f"the cache arguments: {e}")
    record["engine"] = engine_summary(engine)
    record["engine_start_s"] = time.perf_counter() - start
    try:
        vocab = engine.config.model_config.vocab_size
        start = time.perf_counter()
        # Enough prompts to fill one prefill step: fla's chunked kernels compile per step shape,
        # and the timed run's steps are full (two prompts left ~25 s of compiling to the timed
        # run of 256 x 1024 tokens on an H200).
        per_step = engine.config.scheduler_config.max_num_batched_tokens // max(args.input_len, 1)
        warm = random_prompts(min(max(2, per_step + 1), seqs), args.input_len, vocab, args.seed)
        for i, prompt in enumerate(warm):
            engine.add_request(f"warmup-{i}", prompt, greedy(2))
        while engine.has_unfinished_requests():
            engine.step()
        run_warm_up_bands(engine, args.input_len, args.seed)
        record["warmup_s"] = time.perf_counter() - start
        print(f"engine start {record['engine_start_s']:.1f} s, warm-up {record['warmup_s']:.1f} s")
        prompts = random_prompts(args.num_prompts, args.input_len, vocab, args.seed + 1)
        for i, prompt in enumerate(prompts):
            engine.add_request(str(i), prompt, greedy(args.output_len))
        mixed, decodes = [], []
        synchronize(device)
        start = time.perf_counter()
        while engine.has_unfinished_requests():
            decode_only = is_decode_only(engine)
            batch = len(engine.scheduler.running)
            (decodes if decode_only else mixed).append((timed_step(engine), batch))
        elapsed = time.perf_counter() - start
    finally:
        engine.shutdown()
    n = args.num_prompts
    record["results"] = {
        "elapsed_s": elapsed,
        "requests_per_s": n / elapsed,
        "total_tokens_per_s": n * (args.input_len + args.output_len) / elapsed,
        "output_tokens_per_s": n * args.output_len / elapsed,
        "steps_with_prefill": phase(mixed),
        "decode_only_steps": phase(decodes),
    }
    write_json(args.output_json, record)
    print_results(record, args, seqs)
    return 0


def print_results(record: dict[str, Any], args: Any, seqs: int) -> None:
    r, env = record["results"], record["environment"]
    print(
        f"{env['device']}, torch {env['torch']}: {args.num_prompts} prompts x ({args.input_len} "
        f"in, {args.output_len} out), max_num_seqs {seqs}, TP {args.tensor_parallel_size}"
    )
    print(
        f"Throughput: {r['requests_per_s']:.2f} requests/s, {r['total_tokens_per_s']:.2f} total "
        f"tokens/s, {r['output_tokens_per_s']:.2f} output tokens/s ({r['elapsed_s']:.1f} s)"
    )
    for name in ("steps_with_prefill", "decode_only_steps"):
        p = r[name]
        if p["steps"]:
            print(
                f"{name.replace('_', ' ')}: {p['steps']} steps, {p['seconds']:.2f} s, median "
                f"{p['step_ms_median']:.2f} ms, mean batch {p['mean_batch']:.1f}"
            )


if __name__ == "__main__":
    sys.exit(run_main(main))
