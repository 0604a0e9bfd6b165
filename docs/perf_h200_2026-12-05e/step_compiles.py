"""Device-call probe (thirty-sixth run): which Triton kernels compile in steady-state mixed steps.

Call 128's host profile of mixed steps (one prompt prefilling while others decode) found Triton
compiling inside steps after the warm-up: steps took 134 ms with no compile and 394-509 ms with
one. This runs `benchmarks/benchmark_latency.py` (argv) with its batch phase replaced: the prompts
are added, WARM steps run, then Triton's compile hook is set and STEPS steps run one by one; each
step prints its schedule, its wall time, and every kernel compiled in it with the arguments'
specialization (types, constexpr values, divisibility).

    python step_compiles.py <benchmark_latency.py arguments>
"""

import os
import sys
import time

import triton

sys.path.insert(0, "benchmarks")

import benchmark_latency  # noqa: E402

WARM = int(os.environ.get("WARM", "2"))
STEPS = int(os.environ.get("STEPS", "12"))
compiled: list[str] = []


def on_compile(*, key, repr, fn, compile, is_manual_warmup, already_compiled):  # noqa: A002
    compiled.append(f"{fn.module}.{fn.name}: {repr[:600]}")
    return False


def steps(sweep, length: int, batch: int, max_tokens: int, stop_at: float) -> int:
    engine, device = sweep.engine, sweep.device
    for i, prompt in enumerate(benchmark_latency.random_prompts(batch, length, sweep.vocab, 7)):
        engine.add_request(f"c{length}-{i}", prompt, benchmark_latency.greedy(max_tokens))
    for _ in range(WARM):
        engine.step()
    triton.knobs.runtime.jit_cache_hook = on_compile
    for n in range(STEPS):
        running = engine.scheduler.running
        decodes = sum(1 for r in running if r.num_computed_tokens >= len(r.prompt_token_ids))
        benchmark_latency.synchronize(device)
        t0 = time.perf_counter()
        engine.step()
        benchmark_latency.synchronize(device)
        ms = (time.perf_counter() - t0) * 1e3
        what = f"{decodes} decoding, {len(running) - decodes} prefilling"
        print(f"step {n} ({what}): {ms:.1f} ms, {len(compiled)} compiles", flush=True)
        for line in compiled:
            print("   ", line, flush=True)
        compiled.clear()
    triton.knobs.runtime.jit_cache_hook = None
    sweep.abort_all()
    return 0


if __name__ == "__main__":
    benchmark_latency.Sweep.batch_prefill = steps
    sys.exit(benchmark_latency.main(sys.argv[1:]))
