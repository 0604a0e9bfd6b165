"""CUDA-graph decode on a GPU (marked `gpu`): kimi-k3-tiny with the PTPC recipe.

- every configured batch size is captured, with automatic garbage collection paused;
- a mixed workload (prompts of different lengths arriving at different steps, so decode-only steps
  of many sizes and mixed prefill steps) gives the same greedy tokens with graphs and eagerly;
- a graph-replayed decode step neither synchronizes with the host nor compiles anything;
- the decode rows of a mixed step, run eagerly at their own count, compile no decode kernel: the
  MLA ones are those the capture compiled, the KDA ones' mixed-step form those the start-up's
  dummy mixed steps compiled.
"""

import gc
import random

import pytest
import torch
from steps_ahead import greedy_steps_ahead

from vllm.engine.arg_utils import EngineArgs
from vllm.sampling_params import SamplingParams
from vllm.v1.engine.llm_engine import LLMEngine

PTPC = {"linear": "fp8_per_channel", "ignore": ["re:(?!.*self_attn\\.o_proj$).*"]}


def engine(
    enforce_eager: bool, async_scheduling: bool | None = None, max_model_len: int = 512
) -> LLMEngine:
    return LLMEngine.from_engine_args(
        EngineArgs(
            model="kimi-k3-tiny", quantization_config=PTPC, enforce_eager=enforce_eager,
            max_num_seqs=24, max_num_batched_tokens=256, kv_cache_memory=1 << 30,
            max_model_len=max_model_len, async_scheduling=async_scheduling,
        )
    )  # fmt: skip


def workload(eng: LLMEngine) -> dict[str, list[int]]:
    gen = random.Random(0)
    prompts = [[gen.randrange(0, 256) for _ in range(gen.randint(1, 60))] for _ in range(20)]
    params = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
    out, step = {}, 0
    while len(out) < len(prompts):
        if step < len(prompts):
            eng.add_request(str(step), prompts[step], params)
        for o in eng.step():
            if o.finished:
                out[o.request_id] = o.outputs[0].token_ids
        step += 1
    return out


@pytest.mark.gpu
def test_graphs_capture_every_size_and_match_eager():
    graphed = engine(enforce_eager=False)
    try:
        runner = graphed.executor.runner
        sizes = graphed.config.compilation_config.cudagraph_capture_sizes
        assert sizes == [1, 2, 4, 8, 16, 24]
        assert sorted(runner.graphs) == sizes
        with_graphs = workload(graphed)
    finally:
        graphed.shutdown()
    eager = engine(enforce_eager=True)
    try:
        assert not eager.executor.runner.graphs
        assert workload(eager) == with_graphs
    finally:
        eager.shutdown()


@pytest.mark.gpu
def test_captures_run_with_the_garbage_collector_paused(monkeypatch):
    """Every capture of the start-up (decode graphs and KDA prefill graphs) begins with automatic
    collection off (`collector_paused`), and the collector is on again once the engine runs."""
    assert gc.isenabled()
    collector_on = []
    begin = torch.cuda.CUDAGraph.capture_begin

    def recording_begin(self, *args, **kwargs):
        collector_on.append(gc.isenabled())
        return begin(self, *args, **kwargs)

    monkeypatch.setattr(torch.cuda.CUDAGraph, "capture_begin", recording_begin)
    monkeypatch.setenv("VLLM_KDA_PREFILL_GRAPHS", "1")
    eng = engine(enforce_eager=False)
    try:
        runner = eng.executor.runner
        assert runner.prefill_graphs is not None
        assert len(collector_on) == len(runner.graphs) + len(runner.prefill_graphs.replays)
        assert not any(collector_on)
        assert gc.isenabled()
    finally:
        eng.shutdown()


@pytest.mark.gpu
def test_replayed_decode_step_has_no_host_sync_or_compilation(monkeypatch):
    import triton

    # One step per call (the steps launched ahead are checked below).
    eng = engine(enforce_eager=False, async_scheduling=False)
    try:
        params = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
        for i in range(3):
            eng.add_request(str(i), [1, 2, 3 + i], params)
        eng.step()  # the prefill
        runner = eng.executor.runner
        compiled = []
        monkeypatch.setattr(triton.compiler, "compile", lambda *a, **k: compiled.append(a))
        replays = []
        original = runner.execute

        def checked(step):
            assert runner._graph_size(step) == 4
            torch.cuda.synchronize()
            torch.cuda.set_sync_debug_mode("error")
            try:
                logits = original(step)
            finally:
                torch.cuda.set_sync_debug_mode("default")
            replays.append(step)
            return logits

        monkeypatch.setattr(runner, "execute", checked)
        for _ in range(4):
            eng.step()
        assert len(replays) == 4 and not compiled
    finally:
        eng.shutdown()


@pytest.mark.gpu
def test_steps_launched_ahead_replay_graphs_without_host_sync(monkeypatch):
    """Asynchronous scheduling on the graph path: the same tokens as one step at a time, the
    steps launched ahead are graph replays fed on the device, and launching one never waits for
    the device (`greedy_steps_ahead`)."""

    def run(async_scheduling: bool) -> tuple[dict[str, list[int]], int]:
        eng = engine(enforce_eager=False, async_scheduling=async_scheduling)
        try:
            return greedy_steps_ahead(eng, monkeypatch)
        finally:
            eng.shutdown()

    got, ahead = run(True)
    want, none = run(False)
    assert got == want
    assert ahead == 18 and none == 0  # every decode step but the first and the last


@pytest.mark.gpu
def test_mixed_steps_decode_rows_reuse_the_graphs_decode_kernels(monkeypatch):
    """A mixed step runs its decode rows eagerly at their own count; the decode kernels choose
    their launch by the count's batch class, so they reuse what the capture of that class's
    graph compiled. Before, the MLA decode's split count (the SMs // N) was a constexpr of its
    merge kernel, and every new count compiled one inside the step (the probe on an H100: 0.3-2
    s a step). The tiny model's merge runs in the split launch at most counts; without that
    form every count takes the merge kernel. The KDA kernels differ from the graphs' where the
    gate projections run outside them (a mixed step projects every row first): that form each
    class compiled in its first mixed step until start-up ran one dummy mixed step per captured
    size (`ModelRunner.warm_up_mixed_steps`)."""
    import triton

    import vllm.models.kimi_k3.amd.ops.mla_decode_config as mla_config

    monkeypatch.setattr(mla_config, "_FUSED_MERGE_MAX_BYTES", 0)
    eng = engine(enforce_eager=False, async_scheduling=False, max_model_len=4096)
    compiled = []

    def record(*, key, repr, fn, compile, is_manual_warmup, already_compiled):  # noqa: A002
        compiled.append(fn.name)
        return False

    try:
        params = SamplingParams(temperature=0.0, max_tokens=64, ignore_eos=True)
        triton.knobs.runtime.jit_cache_hook = record
        decoding = []
        for step in range(12):  # one new prompt a step: 0, 1, ..., 11 sequences decoding
            eng.add_request(str(step), [1 + step] * 40, params)
            decoding.append(len(eng.scheduler.running))
            eng.step()
        assert decoding == list(range(12))
        for kernel in (
            "_mla_decode_split_kernel", "_mla_decode_merge_kernel",
            "_fused_kda_decode_kernel", "_kda_decode_epilogue_kernel",
        ):  # fmt: skip
            assert kernel not in compiled, compiled
    finally:
        triton.knobs.runtime.jit_cache_hook = None
        eng.shutdown()
