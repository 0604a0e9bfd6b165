"""ModelRunner.available_cache_memory: the caches' byte budget (profiled on a GPU), reduced over TP
ranks."""

import contextlib
from collections.abc import Iterator

import pytest
import torch

import vllm.v1.worker.model_runner as runner_module
from vllm.engine.arg_utils import EngineArgs
from vllm.v1.engine.llm_engine import LLMEngine
from vllm.v1.worker.model_runner import ModelRunner
from vllm.v1.worker.warm_up_bands import warm_up_bands


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


class FakeCudaMemory:
    """torch.cuda's memory queries for a CPU runner: `tensors` bytes in use, `cached` bytes the
    allocator keeps reserved until `empty_cache`, on a device of `total` bytes."""

    def __init__(self, total: int, tensors: int, cached: int) -> None:
        self.total, self.tensors, self.cached = total, tensors, cached

    def install(self, monkeypatch) -> None:
        noop = lambda *args, **kwargs: None  # noqa: E731
        for name in ("synchronize", "reset_peak_memory_stats"):
            monkeypatch.setattr(torch.cuda, name, noop)
        monkeypatch.setattr(torch.cuda, "empty_cache", self.empty_cache)
        monkeypatch.setattr(torch.cuda, "mem_get_info", self.mem_get_info)
        monkeypatch.setattr(torch.cuda, "memory_allocated", lambda *a: self.tensors)
        monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda *a: self.tensors)

    def empty_cache(self) -> None:
        self.cached = 0

    def mem_get_info(self, *args) -> tuple[int, int]:
        return self.total - self.tensors - self.cached, self.total


@contextlib.contextmanager
def tiny_runner(tokens: int, model_len: int) -> Iterator[ModelRunner]:
    """The runner of a kimi-linear-tiny engine with a step budget of `tokens` tokens in up to 4
    sequences of up to `model_len` tokens, shut down after use."""
    eng = LLMEngine.from_engine_args(
        EngineArgs(model="kimi-linear-tiny", max_num_batched_tokens=tokens, max_num_seqs=4,
                   max_model_len=model_len, kv_cache_memory=1 << 24)
    )  # fmt: skip
    try:
        yield eng.executor.runner
    finally:
        eng.shutdown()


def test_profiled_budget_counts_the_allocators_cached_blocks_as_free(
    monkeypatch, torch_reference_kernels
):
    """The profiled budget is `gpu_memory_utilization` of the device minus the memory in use and
    the step's peak: blocks the caching allocator still holds from loading (the 48B model's 1.2
    GiB on the H200, fortieth run) are free for the caches, not used."""
    with tiny_runner(64, 64) as runner:
        gib = 1 << 30
        memory = FakeCudaMemory(total=80 * gib, tensors=10 * gib, cached=2 * gib)
        memory.install(monkeypatch)
        utilization = runner.config.cache_config.gpu_memory_utilization
        expected = int(80 * gib * utilization) - 10 * gib - runner_module._GRAPH_RESERVE_BYTES
        assert runner._profile_gpu_budget() == expected


def test_profiling_forward_then_warms_every_prefill_band(
    monkeypatch, capsys, startup_bars, torch_reference_kernels
):
    """After the profiled step, the profiling run prefills the steps of `warm_up_bands` up to the
    step's tokens on the same throw-away caches, in sequences of at most its longest: a step at
    the top of each band and one a token below the largest (bands of 32 tokens here, for the
    CPU's references; 2048 in the engine), not the profiled step again; then it unbinds those
    caches."""
    steps = []
    with tiny_runner(80, 40) as runner:
        FakeCudaMemory(total=80 << 30, tensors=10 << 30, cached=0).install(monkeypatch)
        monkeypatch.setattr(
            runner_module,
            "warm_up_bands",
            lambda length, budget, below_each: warm_up_bands(length, budget, 32, below_each),
        )
        forward = runner.model.forward

        def recorded(ids, metadata):
            steps.append(metadata.kda.query_start_loc.diff().tolist())
            return forward(ids, metadata)

        monkeypatch.setattr(runner.model, "forward", recorded)
        runner._profile_gpu_budget()
        assert steps == [[40, 40], [32], [40, 24], [40, 39]]
        assert not bound_caches(runner)
        # The band steps behind the start-up progress bar.
        assert "Warming up prefill step sizes: 100%" in capsys.readouterr().err
        # A band step that fails leaves no throw-away cache bound either.
        steps.clear()

        def fails_in_a_band(ids, metadata):
            if steps:
                raise RuntimeError("a band step failed")
            return recorded(ids, metadata)

        monkeypatch.setattr(runner.model, "forward", fails_in_a_band)
        with pytest.raises(RuntimeError, match="a band step failed"):
            runner._profile_gpu_budget()
        assert steps == [[40, 40]] and not bound_caches(runner)


def bound_caches(runner: ModelRunner) -> list[torch.Tensor]:
    """The MLA latent caches and KDA state pools bound to the runner's model's layers."""
    found = (
        getattr(m, name, None)
        for m in runner.model.modules()
        for name in ("kv_cache", "state_pool")
    )
    return [cache for cache in found if cache is not None]


def test_a_given_budget_runs_the_profiling_runs_steps_once(monkeypatch, torch_reference_kernels):
    """Where the budget is given (`kv_cache_memory` here), `warm_up_prefill_steps` runs what the
    profiling run would have: the largest step, then the bands, on throw-away caches it unbinds;
    once (a second call, or one after a profiling run, runs nothing); nothing off the GPU."""
    steps = []
    with tiny_runner(80, 40) as runner:
        forward = runner.model.forward

        def recorded(ids, metadata):
            steps.append(metadata.kda.query_start_loc.diff().tolist())
            return forward(ids, metadata)

        monkeypatch.setattr(runner.model, "forward", recorded)
        runner.warm_up_prefill_steps()  # the CPU: nothing
        assert steps == []
        monkeypatch.setattr(runner, "_on_gpu", lambda: True)
        FakeCudaMemory(total=80 << 30, tensors=10 << 30, cached=0).install(monkeypatch)
        monkeypatch.setattr(
            runner_module,
            "warm_up_bands",
            lambda length, budget, below_each: warm_up_bands(length, budget, 32, below_each),
        )
        runner.warm_up_prefill_steps()
        assert steps == [[40, 40], [32], [40, 24], [40, 39]]
        assert not bound_caches(runner)
        runner.warm_up_prefill_steps()
        assert len(steps) == 4
        runner.prefill_bands_warmed = False
        runner._profile_gpu_budget()
        assert len(steps) == 8
        runner.warm_up_prefill_steps()
        assert len(steps) == 8


@pytest.mark.parametrize("override", [None, 40])
def test_engine_start_warms_up_prefill_steps_after_the_sizing(monkeypatch, override):
    """Every engine start asks the runners for the prefill warm-up after the cache sizing and
    before the caches are allocated, whether the budget was profiled, given, or replaced by a
    block count."""
    calls = []
    for name in ("available_cache_memory", "warm_up_prefill_steps", "initialize_cache"):
        method = getattr(ModelRunner, name)

        def recorded(self, *args, method=method, name=name):
            calls.append(name)
            return method(self, *args)

        monkeypatch.setattr(ModelRunner, name, recorded)
    eng = LLMEngine.from_engine_args(
        EngineArgs(model="kimi-linear-tiny", max_num_seqs=4, max_model_len=64,
                   kv_cache_memory=1 << 24, num_gpu_blocks_override=override)
    )  # fmt: skip
    eng.shutdown()
    expected = ["warm_up_prefill_steps", "initialize_cache"]
    assert calls == (expected if override else ["available_cache_memory", *expected])


def test_a_failure_before_the_first_step_leaves_no_throw_away_cache_bound(monkeypatch):
    """The throw-away caches are unbound even when what follows their binding fails (here the
    metadata builder, as an allocation that runs out of memory would)."""
    with tiny_runner(80, 40) as runner:
        FakeCudaMemory(total=80 << 30, tensors=10 << 30, cached=0).install(monkeypatch)

        def no_memory(*args):
            assert bound_caches(runner)  # bound by then
            raise torch.OutOfMemoryError("no memory for the metadata")

        monkeypatch.setattr(runner_module, "KimiMetadataBuilder", no_memory)
        with pytest.raises(torch.OutOfMemoryError):
            runner._profile_gpu_budget()
        assert not bound_caches(runner)


def test_the_profiling_runs_steps_run_without_the_kda_prefill_graphs(monkeypatch):
    """The KDA prefill graphs are off in the profiled steps (the peak must be the eager core's,
    which steps outside their buckets take) and on again after, a failed step included."""
    with tiny_runner(80, 40) as runner:
        FakeCudaMemory(total=80 << 30, tensors=10 << 30, cached=0).install(monkeypatch)
        graphs = runner.prefill_graphs = type("Graphs", (), {"enabled": True})()
        seen = []
        forward = runner.model.forward

        def recorded(ids, metadata):
            seen.append(graphs.enabled)
            return forward(ids, metadata)

        monkeypatch.setattr(runner.model, "forward", recorded)
        runner._profile_gpu_budget()
        assert seen and not any(seen) and graphs.enabled

        def fails(ids, metadata):
            raise RuntimeError("the step failed")

        monkeypatch.setattr(runner.model, "forward", fails)
        with pytest.raises(RuntimeError, match="the step failed"):
            runner._profile_gpu_budget()
        assert graphs.enabled
