"""ModelRunner.available_cache_memory: the caches' byte budget, reduced over TP ranks."""

import pytest
import torch

import vllm.v1.worker.model_runner as runner_module
from vllm.v1.worker.model_runner import ModelRunner


def cpu_runner() -> ModelRunner:
    # Only what the budget reads: the device and the cache config.
    runner = ModelRunner.__new__(ModelRunner)
    runner.device = torch.device("cpu")
    cache = type("Cache", (), {"kv_cache_memory": None})
    runner.config = type("Config", (), {"cache_config": cache})
    return runner


def test_no_cache_budget_raises_on_every_rank_after_the_reduction(monkeypatch):
    """A rank with no memory left for the caches raises only after the TP reduction of the
    budgets: raising before it would leave the other ranks waiting in it until the collective
    timeout. (On the GPU the budget is profiled; here the CPU default stands in for it.)"""
    runner = cpu_runner()
    reduced = []

    def all_reduce(t, op):
        reduced.append(t.item())
        return torch.minimum(t, torch.tensor([float(1 << 30)], dtype=t.dtype))

    monkeypatch.setattr(runner_module, "get_tensor_model_parallel_world_size", lambda: 2)
    monkeypatch.setattr(runner_module, "tensor_model_parallel_all_reduce", all_reduce)
    monkeypatch.setattr(runner_module, "_CPU_DEFAULT_CACHE_BYTES", 0)
    with pytest.raises(ValueError, match="no GPU memory left for the caches"):
        runner.available_cache_memory()
    assert reduced == [0.0]
    monkeypatch.setattr(runner_module, "_CPU_DEFAULT_CACHE_BYTES", 1 << 20)
    assert runner.available_cache_memory() == 1 << 20
