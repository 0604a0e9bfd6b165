"""Device-call probe (thirty-first run): where the host time of steady-state mixed steps goes.

Call 110 found the batch phase's mixed steps (prompts prefilled while earlier ones decode) at
~0.32 s a step where a prefill-only step of 8192 tokens takes ~0.12 s, and call 124 found the
device idle between launches in them, with no host-device sync of the engine's own. This runs
`benchmarks/benchmark_latency.py` (argv) with its batch phase replaced: the prompts are added,
WARM steps run untimed (new shapes compile), TIMED steps run back to back and are timed as a
whole, then the same number of steps is timed one by one with the schedule of each, one step runs
under torch.profiler (device busy against wall), and PROFILED steps run under cProfile (host time
by function, sorted by own time and by cumulative time).

    python host_profile.py <benchmark_latency.py arguments>
"""

import cProfile
import io
import os
import pstats
import sys
import time

sys.path.insert(0, "benchmarks")

import benchmark_latency  # noqa: E402
from step_profile import profile_steps_and_gaps  # noqa: E402

WARM = int(os.environ.get("WARM", "6"))
TIMED = int(os.environ.get("TIMED", "6"))
PROFILED = int(os.environ.get("PROFILED", "4"))


def schedule_of(engine) -> str:
    running = engine.scheduler.running
    decodes = sum(1 for r in running if r.num_computed_tokens >= len(r.prompt_token_ids))
    return f"{decodes} decoding, {len(running) - decodes} prefilling"


def steady_steps(sweep, length: int, batch: int, max_tokens: int, stop_at: float) -> int:
    engine, device = sweep.engine, sweep.device
    for i, prompt in enumerate(benchmark_latency.random_prompts(batch, length, sweep.vocab, 7)):
        engine.add_request(f"host{length}-{i}", prompt, benchmark_latency.greedy(max_tokens))
    for _ in range(WARM):
        engine.step()
    benchmark_latency.synchronize(device)
    start = time.perf_counter()
    for _ in range(TIMED):
        engine.step()
    benchmark_latency.synchronize(device)
    print(f"\nL={length} B={batch}: {TIMED} steps back to back, "
          f"{(time.perf_counter() - start) / TIMED * 1e3:.1f} ms a step")  # fmt: skip
    for _ in range(TIMED):
        what = schedule_of(engine)
        benchmark_latency.synchronize(device)
        t0 = time.perf_counter()
        engine.step()
        t1 = time.perf_counter()
        benchmark_latency.synchronize(device)
        t2 = time.perf_counter()
        print(f"  step ({what}): host in step() {(t1 - t0) * 1e3:.1f} ms, "
              f"to the device's end {(t2 - t0) * 1e3:.1f} ms")  # fmt: skip
    what = schedule_of(engine)
    benchmark_latency.synchronize(device)
    t0 = time.perf_counter()
    kernels, gaps = profile_steps_and_gaps(engine.step, 1, device)
    wall = (time.perf_counter() - t0) * 1e3
    busy = sum(k.us_per_step for k in kernels) / 1e3
    print(f"  torch.profiler step ({what}): wall {wall:.1f} ms (profiled), device busy "
          f"{busy:.1f} ms, {sum(k.calls_per_step for k in kernels):.0f} kernels")  # fmt: skip
    if gaps is not None:
        print(f"  idle {gaps.short_us / 1e3:.1f} ms in {gaps.short_count:.0f} gaps <= 20 us, "
              f"{gaps.long_us / 1e3:.1f} ms in {gaps.long_count:.0f} longer")  # fmt: skip
    if not PROFILED:
        sweep.abort_all()
        return 0
    profiler = cProfile.Profile()
    whats = []
    benchmark_latency.synchronize(device)
    t0 = time.perf_counter()
    profiler.enable()
    for _ in range(PROFILED):
        whats.append(schedule_of(engine))
        engine.step()
    benchmark_latency.synchronize(device)
    profiler.disable()
    print(f"  cProfile: {PROFILED} steps ({'; '.join(whats)}) in "
          f"{(time.perf_counter() - t0) * 1e3:.1f} ms")  # fmt: skip
    for key in ("tottime", "cumulative"):
        out = io.StringIO()
        stats = pstats.Stats(profiler, stream=out)
        stats.sort_stats(key).print_stats(45)
        print(f"\n--- L={length} B={batch} by {key} ---")
        print("\n".join(line[:200] for line in out.getvalue().splitlines()[6:]))
    sweep.abort_all()
    return 0


if __name__ == "__main__":
    benchmark_latency.Sweep.batch_prefill = steady_steps
    sys.exit(benchmark_latency.main(sys.argv[1:]))
