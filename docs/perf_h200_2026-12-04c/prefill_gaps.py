"""Device-call probe (twenty-sixth run): where the host keeps the device waiting in an 8k
prefill. Runs `benchmarks/benchmark_latency.py` (argv) with its prefill profile preceded by one
more prefill under torch.profiler with CPU and CUDA activity: for each device gap over 100 us
between two kernels, the host's operators and CUDA runtime / driver calls between the two
kernels' launches, longest first (after call 102 it also matches the driver API's launches,
which Triton's kernels go through).

    python prefill_gaps.py <benchmark_latency.py arguments> --profile-prefill
"""

import json
import os
import sys
import tempfile

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, "benchmarks")

import benchmark_latency  # noqa: E402

GAP_US = 100
SHOWN = 8


def host_behind_gaps(trace_path: str) -> None:
    with open(trace_path) as f:
        events = [e for e in json.load(f)["traceEvents"] if e.get("ph") == "X"]
    kernels = sorted(
        (e for e in events if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")),
        key=lambda e: e["ts"],
    )
    # Triton launches through the driver API (cuLaunchKernelEx: "cuda_driver"), torch through
    # the runtime's.
    launch_at = {
        e["args"]["correlation"]: e
        for e in events
        if e.get("cat") in ("cuda_runtime", "cuda_driver") and "correlation" in e.get("args", {})
    }
    host = [
        e
        for e in events
        if e.get("cat") in ("cpu_op", "cuda_runtime", "cuda_driver", "python_function")
    ]
    gaps = []
    for a, b in zip(kernels, kernels[1:], strict=False):
        gap = b["ts"] - (a["ts"] + a["dur"])
        if gap > GAP_US:
            gaps.append((gap, a, b))
    print(f"{len(gaps)} device gaps over {GAP_US} us, {sum(g for g, _, _ in gaps):.0f} us")
    for gap, a, b in sorted(gaps, key=lambda g: -g[0])[:12]:
        la = launch_at.get(a["args"].get("correlation"))
        lb = launch_at.get(b["args"].get("correlation"))
        print(f"\n{gap:.0f} us: {a['name'][:60]} -> {b['name'][:60]}")
        if la is None or lb is None:
            print("  (launches not found)")
            continue
        t0, t1 = la["ts"] + la["dur"], lb["ts"]
        print(f"  host between the launches: {t1 - t0:.0f} us")
        inside = [e for e in host if t0 <= e["ts"] and e["ts"] + e["dur"] <= t1 + 1]
        for e in sorted(inside, key=lambda e: -e["dur"])[:SHOWN]:
            print(f"  {e['dur']:8.0f} us  {e['cat']:>12}  {e['name'][:90]}")


def main() -> int:
    original = benchmark_latency.profile_steps_and_gaps

    def with_host(step, steps, device):
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            step()
            torch.cuda.synchronize(device)
        path = os.path.join(tempfile.mkdtemp(), "trace.json")
        prof.export_chrome_trace(path)
        host_behind_gaps(path)
        return original(step, steps, device)

    benchmark_latency.profile_steps_and_gaps = with_host
    return benchmark_latency.main(sys.argv[1:])


if __name__ == "__main__":
    sys.exit(main())
