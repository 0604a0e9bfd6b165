"""The kernel benchmarks' CUDA-graph timings start only after `WARM_UP_S` of replays: right after
a new set of weights was made, the first timing of them took 17% longer than every later one
(benchmarks/kernels/kernel_bench.py)."""

import importlib
import time
from pathlib import Path

import pytest
import torch

KERNELS = Path(__file__).resolve().parents[2] / "benchmarks" / "kernels"


@pytest.mark.gpu
def test_a_captured_graph_is_replayed_for_the_warm_up_before_it_is_timed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.syspath_prepend(str(KERNELS))
    kernel_bench = importlib.import_module("kernel_bench")
    counter = torch.zeros(1, dtype=torch.int64, device="cuda")
    start = time.perf_counter()
    kernel_bench._capture(lambda: counter.add_(1), 2)
    elapsed = time.perf_counter() - start
    # Three eager calls, then replays of the two captured ones (capturing runs nothing).
    calls = int(counter.item()) - 3
    assert calls % 2 == 0 and calls // 2 >= 2
    assert elapsed >= kernel_bench.WARM_UP_S
