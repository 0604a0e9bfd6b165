"""Device-call probe, prepared in the twenty-seventh run for the next: where the batch phase's
mixed steps go. In call 110 the batch phase of 64 prompts of 8k (prompts prefilled while the
early ones decode, in eager mixed steps) took about 0.32 s a step where a prefill-only step of
8192 tokens takes 0.12 s. This runs `benchmarks/benchmark_latency.py` (argv) with its batch
phase's first PROFILED steps each under torch.profiler: per step its wall time, the schedule
(decodes, prefill rows and tokens), device busy time, the kernel groups and the longest gaps.

    python mixed_steps.py <benchmark_latency.py arguments>
"""

import os
import sys
import time
from collections import defaultdict

sys.path.insert(0, "benchmarks")

import benchmark_latency  # noqa: E402
from step_profile import profile_steps_and_gaps  # noqa: E402

PROFILED = int(os.environ.get("PROFILED", "4"))


def profiled_steps(sweep, length: int, batch: int, max_tokens: int, stop_at: float) -> int:
    engine, device = sweep.engine, sweep.device
    for i, prompt in enumerate(benchmark_latency.random_prompts(batch, length, sweep.vocab, 7)):
        engine.add_request(f"mixed{length}-{i}", prompt, benchmark_latency.greedy(max_tokens))
    for step in range(PROFILED):
        sched = engine.scheduler
        decodes = sum(1 for r in sched.running if r.num_computed_tokens >= len(r.prompt_token_ids))
        benchmark_latency.synchronize(device)
        start = time.perf_counter()
        kernels, gaps = profile_steps_and_gaps(engine.step, 1, device)
        wall_us = (time.perf_counter() - start) * 1e6
        groups = defaultdict(float)
        for k in kernels:
            groups[k.group] += k.us_per_step
        busy = sum(groups.values())
        print(f"\nL={length} step {step}: wall {wall_us:.0f} us (profiled), device busy "
              f"{busy:.0f} us, {decodes} sequences decoding before it")  # fmt: skip
        for group, us in sorted(groups.items(), key=lambda g: -g[1]):
            print(f"  {us:9.0f} us  {group}")
        for k in kernels[:8]:
            print(f"  {k.us_per_step:9.0f} us  x{k.calls_per_step:.0f}  {k.name[:90]}")
        if gaps is not None:
            print(f"  idle {gaps.long_us:.0f} us in {gaps.long_count:.0f} gaps over 20 us")
            for site in gaps.long_sites[:6]:
                print(f"    {site.us:7.0f} us x{site.count:.0f}: {site.before[:45]} -> "
                      f"{site.after[:45]}")  # fmt: skip
    sweep.abort_all()
    return 0


if __name__ == "__main__":
    benchmark_latency.Sweep.batch_prefill = profiled_steps
    sys.exit(benchmark_latency.main(sys.argv[1:]))
