"""Device-call probe (forty-second run): does the 1k prompt alone replay the KDA prefill graphs in
every process? `benchmarks/benchmark_latency.py` (argv) runs with `KdaPrefillGraphs.run` and
`LLMEngine.step` wrapped: per engine step with KDA prefill calls, its wall ms (no sync added:
with asynchronous scheduling a step's wall is the host's), how many of its KDA layers replayed a
graph and how many ran eagerly, and why (`run` returned None: replays off, no bucket, no gate,
another lower bound, device, or shapes / dtypes).

The 1k prompt alone took 0.033-0.035 s in some processes and 0.045-0.061 s in others (calls 148,
154-156), consistently within a process. 20 KDA layers running fla-core's `chunk_kda` eagerly
cost about 1.3-1.4 ms of host time each on an H100 (thirty-ninth run): about the difference.

    python replay_probe.py <benchmark_latency.py arguments>
"""

import sys
import time
from collections import Counter

sys.path.insert(0, "benchmarks")

import benchmark_latency  # noqa: E402

from vllm.models.kimi_k3.amd.ops import kda_prefill_graphs as kpg  # noqa: E402
from vllm.v1.engine.llm_engine import LLMEngine  # noqa: E402

calls: Counter = Counter()
state = {"step": -1}
_run = kpg.KdaPrefillGraphs.run


def why_none(self, q, slots, gate) -> str:
    bucket = kpg.pick_bucket(q.shape[0], slots.shape[0], self.token_buckets, self.seq_buckets)
    if not self.enabled:
        return "replays off"
    if bucket not in self.replays:
        return f"no bucket for {q.shape[0]} tokens / {slots.shape[0]} seqs"
    if gate is None:
        return "no gate"
    if gate.lower_bound != self.lower_bound:
        return "lower bound"
    if q.device != self.qkvg.device:
        return "device"
    return f"shape or dtype ({tuple(q.shape)} {q.dtype})"


def counted_run(self, q, k, v, g, beta, state_, qsl, slots, has_init, gate):
    out = _run(self, q, k, v, g, beta, state_, qsl, slots, has_init, gate)
    calls["replay" if out is not None else "eager: " + why_none(self, q, slots, gate)] += 1
    return out


kpg.KdaPrefillGraphs.run = counted_run
_step = LLMEngine.step


def probed_step(self, *args, **kwargs):
    state["step"] += 1
    calls.clear()
    t0 = time.perf_counter()
    try:
        return _step(self, *args, **kwargs)
    finally:
        wall = (time.perf_counter() - t0) * 1e3
        if calls:
            running = len(self.scheduler.running)
            print(f"[step {state['step']}] wall {wall:.1f} ms, {running} running, "
                  f"KDA {dict(calls)}", flush=True)  # fmt: skip


LLMEngine.step = probed_step

if __name__ == "__main__":
    sys.exit(benchmark_latency.main(sys.argv[1:]))
