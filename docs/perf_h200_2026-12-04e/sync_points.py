"""Device-call probe, prepared in the twenty-ninth run for the next: where an eager step makes
the host wait for the device. A wait empties the device's queue, and the host then launches the
next kernels while the device idles: the twenty-sixth run saw gaps of 0.3-1.1 ms at the same
sites of an 8k prefill from run to run (fla-core's first `chunk_kda`, the conv after the first
gate, the metadata upload), and fla-core reads its chunk offsets back to the host once a step.

This runs `benchmarks/benchmark_latency.py` (argv) with its batch phase replaced: the prompts are
added at once, and the first STEPS steps run under `torch.cuda.set_sync_debug_mode("warn")`.
Every synchronizing call is reported with the Python frames that made it (the innermost
PROBE_FRAMES of them), grouped by call site, with its count per step. The first step is
prefill-only and the later ones mixed (decodes beside a prompt's chunks).

    STEPS=3 python docs/perf_h200_2026-12-04e/sync_points.py <benchmark_latency.py arguments>

(from the repository root: it imports `benchmarks/` by that relative path)
"""

import os
import sys
import time
import traceback
import warnings
from collections import Counter

import torch

sys.path.insert(0, "benchmarks")

import benchmark_latency  # noqa: E402

STEPS = int(os.environ.get("STEPS", "3"))
PROBE_FRAMES = int(os.environ.get("PROBE_FRAMES", "6"))


def site_of(stack: list[traceback.FrameSummary]) -> str:
    # Frames inside the warnings machinery and this probe are noise.
    frames = [f for f in stack if "warnings" not in f.filename and __file__ not in f.filename]
    inner = reversed(frames[-PROBE_FRAMES:])
    return " <- ".join(f"{os.path.relpath(f.filename)}:{f.lineno} {f.name}" for f in inner)


def probed_steps(sweep, length: int, batch: int, max_tokens: int, stop_at: float) -> int:
    engine, device = sweep.engine, sweep.device
    for i, prompt in enumerate(benchmark_latency.random_prompts(batch, length, sweep.vocab, 11)):
        engine.add_request(f"sync{length}-{i}", prompt, benchmark_latency.greedy(max_tokens))
    original = warnings.showwarning
    for step in range(STEPS):
        sites: Counter[str] = Counter()

        def record(message, category, filename, lineno, file=None, line=None, sites=sites):
            if "synchroniz" in str(message):
                sites[site_of(traceback.extract_stack())] += 1
            else:
                original(message, category, filename, lineno, file, line)

        benchmark_latency.synchronize(device)
        warnings.showwarning = record
        if device.type == "cuda":
            torch.cuda.set_sync_debug_mode("warn")
        start = time.perf_counter()
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("always")
                warnings.showwarning = record
                engine.step()
        finally:
            if device.type == "cuda":
                torch.cuda.set_sync_debug_mode("default")
            warnings.showwarning = original
        benchmark_latency.synchronize(device)
        wall_ms = (time.perf_counter() - start) * 1e3
        print(f"\nL={length} step {step}: {wall_ms:.1f} ms, {sum(sites.values())} synchronizing "
              f"calls at {len(sites)} sites")  # fmt: skip
        for site, count in sites.most_common():
            print(f"  x{count}: {site}")
    sweep.abort_all()
    return 0


if __name__ == "__main__":
    benchmark_latency.Sweep.batch_prefill = probed_steps
    sys.exit(benchmark_latency.main(sys.argv[1:]))
