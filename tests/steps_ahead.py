"""One greedy workload through an engine with its steps launched ahead watched, for the GPU tests
of asynchronous scheduling on the graph path (tests/v1/worker/test_cuda_graphs.py at TP = 1,
test_tp2_gpu.py at TP = 2)."""

import random

import pytest
import torch

from vllm.sampling_params import SamplingParams
from vllm.v1.engine.llm_engine import LLMEngine


def greedy_steps_ahead(
    eng: LLMEngine, monkeypatch: pytest.MonkeyPatch
) -> tuple[dict[str, list[int]], int]:
    """Six prompts of 1-40 random tokens (one prefill step under a budget of 256 tokens), 20
    greedy tokens each, to the end: (tokens by request, steps launched ahead). Every step
    launched ahead must be a graph replay, and launching one must not wait for the device (so
    the step in flight keeps running). Every sequence runs to the same length, so one run at a
    time and one launched ahead decode the same batches: a sequence that ends before the others
    keeps its row in the step launched after its end, and a batch of another size may round
    differently."""
    runner = eng.executor.runner
    execute, launch_ahead = runner.execute, eng._launch_ahead
    ahead = []

    def spy(step):
        if step.input_ids is None:
            assert runner._graph_size(step) is not None
            ahead.append(step)
        return execute(step)

    def unsynchronized(launched):
        torch.cuda.set_sync_debug_mode("error")
        try:
            return launch_ahead(launched)
        finally:
            torch.cuda.set_sync_debug_mode("default")

    monkeypatch.setattr(runner, "execute", spy)
    monkeypatch.setattr(eng, "_launch_ahead", unsynchronized)
    gen = random.Random(1)
    params = SamplingParams(temperature=0.0, max_tokens=20, ignore_eos=True)
    for i in range(6):
        prompt = [gen.randrange(0, 256) for _ in range(gen.randint(1, 40))]
        eng.add_request(str(i), prompt, params)
    out = {}
    while eng.has_unfinished_requests():
        for o in eng.step():
            if o.finished:
                out[o.request_id] = list(o.outputs[0].token_ids)
    return out, len(ahead)
