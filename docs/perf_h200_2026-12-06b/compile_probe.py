"""Device-call probe (forty-first run): which Triton compiles and autotunes land in the steps of
`benchmarks/benchmark_latency.py` (argv), and how long each step takes.

Call 154 found the steady-state steps of the 256 x 1k batch phase at ~130 ms (a second process
with a warm Triton cache: 123-141 ms from its first step), where the grid's phase on a fresh
machine averaged 347 ms a step: the suspicion is kernels first compiled inside the phase. Every
Triton JIT compile of the process (a disk-cache load included) is logged with its duration and
the engine step it falls in; each `LLMEngine.step` over 180 ms is logged with the compiles inside
it. Set TRITON_PRINT_AUTOTUNING=1 to see autotuning too.

    python compile_probe.py <benchmark_latency.py arguments>
"""

import sys
import time

from triton import knobs

sys.path.insert(0, "benchmarks")

import benchmark_latency  # noqa: E402

from vllm.v1.engine.llm_engine import LLMEngine  # noqa: E402

started: dict[str, float] = {}
compiles: list[tuple[float, float, str]] = []
state = {"step": -1, "in_step": False}


def before_compile(**kw) -> bool:
    started[kw.get("repr") or str(kw.get("fn"))] = time.perf_counter()
    return False


def after_compile(**kw) -> None:
    end = time.perf_counter()
    name = kw.get("repr") or str(kw.get("fn"))
    seconds = end - started.pop(name, end)
    compiles.append((end, seconds, name))
    if seconds > 0.05:
        where = f"step {state['step']}" if state["in_step"] else "outside steps"
        print(f"[compile {seconds:.2f} s, {where}] {name[:400]}", flush=True)


knobs.runtime.jit_cache_hook = before_compile
knobs.runtime.jit_post_compile_hook = after_compile

_step = LLMEngine.step


def timed_step(self, *args, **kwargs):
    state["step"] += 1
    state["in_step"] = True
    first = len(compiles)
    t0 = time.perf_counter()
    try:
        return _step(self, *args, **kwargs)
    finally:
        state["in_step"] = False
        ms = (time.perf_counter() - t0) * 1e3
        inside = compiles[first:]
        if ms > 180 or inside:
            spent = sum(s for _, s, _ in inside)
            running = self.scheduler.running
            print(f"[step {state['step']}] {ms:.0f} ms, {len(running)} running, "
                  f"{len(inside)} compiles ({spent:.2f} s)", flush=True)  # fmt: skip


LLMEngine.step = timed_step

if __name__ == "__main__":
    code = benchmark_latency.main(sys.argv[1:])
    total = sum(s for _, s, _ in compiles)
    print(f"{len(compiles)} JIT compiles in the process, {total:.1f} s", flush=True)
    sys.exit(code)
