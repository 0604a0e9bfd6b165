"""Why a second set of expert weights in one process reads slower (call 190: Kimi-K3's two
tokens 90.7 us on the first `make_moe` of a process, 105.0-105.6 on the second, same values).

One process per shape: A = make_moe (seed 0), timed; B = make_moe again with A alive, timed; A
timed again (time or heat would slow A too; placement would not); B freed, the cache emptied,
C = make_moe, timed. Each timing: the default GEMV experts (three times) and the grouped Triton
path (once; call 185 had it ahead of the GEMV path at four Kimi-K3 tokens, in a process where
another case ran first), graph replay of 10 calls (the benchmark's default), median of 50
replays. Prints each set's w13 / w2 addresses.

    python docs/perf_h200_2026-12-06h/alloc_probe.py kimi-k3-tp8 2
"""

import sys

import torch

sys.path.insert(0, "benchmarks/kernels")
from benchmark_moe import SHAPES, make_moe  # noqa: E402
from kernel_bench import time_graph  # noqa: E402

from vllm.model_executor.layers.activation import SiluAndMul, SituAndMul  # noqa: E402
from vllm.model_executor.layers.fused_moe.experts_triton import moe_experts_triton  # noqa: E402
from vllm.model_executor.layers.fused_moe.experts_triton_grouped import (  # noqa: E402
    moe_experts_triton_grouped,
)


def main() -> None:
    shape_name, tokens = sys.argv[1], int(sys.argv[2])
    shape = SHAPES[shape_name]
    k3 = shape_name.startswith("kimi-k3")
    act = SituAndMul(4.0, 25.0) if k3 else SiluAndMul()
    shared = 0 if k3 else 1
    device = torch.device("cuda")

    def timed(name: str, inputs) -> None:
        x, w13, w2, weights, ids = inputs
        us = [time_graph(lambda: moe_experts_triton(x, w13, w2, weights, ids, act), 10)
              for _ in range(3)]  # fmt: skip
        grouped = time_graph(lambda: moe_experts_triton_grouped(x, w13, w2, weights, ids, act), 10)
        print(f"{shape_name} T={tokens} {name}: GEMV " + " ".join(f"{u:7.2f}" for u in us)
              + f" us, grouped {grouped:7.2f} us  w13 0x{w13.data_ptr():x} w2 0x{w2.data_ptr():x}",
              flush=True)  # fmt: skip

    with torch.inference_mode():
        a = make_moe(shape, tokens, device, 0, shared)
        timed("A first", a)
        b = make_moe(shape, tokens, device, 0, shared)
        timed("B second", b)
        timed("A again", a)
        del b
        torch.cuda.empty_cache()
        c = make_moe(shape, tokens, device, 0, shared)
        timed("C after B freed", c)
        timed("A last", a)


if __name__ == "__main__":
    main()
