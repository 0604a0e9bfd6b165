"""Differential check of the engine's scheduling (tiny model, CPU, torch reference kernels): every
request of a seeded random workload, run together with the others (arriving mid-run, aborted,
preempted, prefilled in chunks, queued behind `max_num_seqs`, with request ids reused once
finished, with and without asynchronous scheduling), gives the tokens, finish reasons, logprobs and
prompt logprobs it gives alone in an idle engine; and once the workload drains, nothing is left
held: blocks, KDA slots, queued requests, per-request sampler state, output state.
"""

import math
import random
from dataclasses import replace

import pytest

from vllm.engine.arg_utils import EngineArgs
from vllm.sampling_params import RequestOutputKind, SamplingParams
from vllm.v1.engine.llm_engine import LLMEngine

MODEL = "kimi-k3-tiny"
MAX_MODEL_LEN = 48
# Tokens are compared exactly. Logprobs are fp32 values whose reductions run over a batch that
# differs from the one alone (other rows, prefill chunks), so they agree to fp32 rounding, not bit
# for bit: these workloads differ by at most 8e-6.
LOGPROB_ABS_TOL = 1e-4


@pytest.fixture(scope="module", autouse=True)
def reference_kernels(torch_reference_kernels):
    """Scheduling is under test, not kernels."""


def make_engine(**kwargs) -> LLMEngine:
    args = dict(model=MODEL, max_num_seqs=8, max_num_batched_tokens=128, block_size=4,
                kv_cache_memory=64 << 20, max_model_len=MAX_MODEL_LEN)  # fmt: skip
    args.update(kwargs)
    return LLMEngine.from_engine_args(EngineArgs(**args))


@pytest.fixture(scope="module")
def alone():
    """The final output of one request run alone in an idle engine (whole-prompt prefill)."""
    engine = make_engine(max_num_seqs=1)
    cache = {}

    def run(prompt: list[int], params: SamplingParams):
        params = replace(params, output_kind=RequestOutputKind.CUMULATIVE)
        key = (tuple(prompt), repr(params))
        if key not in cache:
            engine.add_request("alone", prompt, params)
            while engine.has_unfinished_requests():
                for out in engine.step():
                    if out.finished:
                        cache[key] = out
        return cache[key]

    yield run
    engine.shutdown()


def random_workload(gen: random.Random, alone, num: int, block_size: int, chunk: int) -> list:
    """(prompt, params) per request: prompt lengths around a block and a prefill chunk, greedy and
    seeded sampling, n = 2, logprobs, prompt logprobs, stop token ids met mid-output, outputs that
    run to `max_model_len`."""
    requests = []
    for _ in range(num):
        length = gen.choice([1, block_size - 1, block_size, block_size + 1, chunk + 1,
                             gen.randint(2, 32), gen.randint(2, 32)])  # fmt: skip
        prompt = [gen.randrange(0, 300) for _ in range(length)]
        params = SamplingParams(temperature=0.0, max_tokens=gen.randint(1, 12), ignore_eos=True)
        if gen.random() < 0.15:  # to max_model_len: the room the prompt leaves
            params = replace(params, max_tokens=None)
        if gen.random() < 0.3:
            params = replace(
                params, temperature=1.0, top_k=gen.choice([0, 5]), seed=gen.randrange(99)
            )
        if gen.random() < 0.3:
            params = replace(params, logprobs=gen.choice([0, 2]))
        if gen.random() < 0.2:
            params = replace(params, prompt_logprobs=1)
        if gen.random() < 0.2:
            params = replace(params, n=2)
        if gen.random() < 0.3:
            tokens = alone(prompt, params).outputs[0].token_ids
            params = replace(params, stop_token_ids=[tokens[gen.randrange(len(tokens))]])
        if gen.random() < 0.3:
            params = replace(params, output_kind=RequestOutputKind.FINAL_ONLY)
        requests.append((prompt, params))
    return requests


def assert_close_logprobs(got, want, what: str) -> None:
    assert (got is None) == (want is None), what
    if got is None:
        return
    assert len(got) == len(want), what
    for i, (g, w) in enumerate(zip(got, want, strict=True)):
        assert (g is None) == (w is None), f"{what}[{i}]"
        if g is None:
            continue
        assert g.keys() == w.keys(), f"{what}[{i}]"
        for token in g:
            assert g[token].rank == w[token].rank, f"{what}[{i}][{token}]"
            assert math.isclose(g[token].logprob, w[token].logprob, abs_tol=LOGPROB_ABS_TOL), (
                f"{what}[{i}][{token}]: {g[token].logprob} != {w[token].logprob}"
            )


def assert_drained(engine: LLMEngine) -> None:
    """Nothing is held once every request has finished, not even a step launched ahead."""
    assert not engine.step_in_flight
    kv, scheduler, runner = engine.kv_cache_manager, engine.scheduler, engine.executor.runner
    assert kv.num_free_blocks == kv.initial_num_free_blocks
    assert kv.num_free_kda_slots == kv.initial_num_free_kda_slots
    assert not kv.block_tables and not kv.kda_slots
    assert not scheduler.requests and not scheduler.running and not scheduler.waiting
    assert not scheduler._pending
    assert not runner.generators and not runner.prompt_logprobs_done
    assert not engine.output_processor.requests and not engine.output_processor.parent_of


CASES = {
    # A pool of one max_model_len sequence: preemption by recompute; chunked prefill; requests
    # queued behind max_num_seqs.
    "sync": dict(max_num_seqs=3, max_num_batched_tokens=8, num_gpu_blocks_override=12,
                 kv_cache_memory=None, async_scheduling=False),
    # The same with decode steps launched ahead (the engine launches none that would preempt).
    "async": dict(max_num_seqs=4, max_num_batched_tokens=16, block_size=4,
                  num_gpu_blocks_override=12, kv_cache_memory=None, async_scheduling=True),
}  # fmt: skip


# A seed whose workloads preempt in both configurations (asserted below); one keeps it fast.
@pytest.mark.parametrize("seed", [1])
@pytest.mark.parametrize("name", CASES)
def test_requests_together_equal_each_alone(alone, name, seed):
    kwargs = CASES[name]
    gen = random.Random(f"{name}{seed}")
    block_size, chunk = kwargs.get("block_size", 4), kwargs["max_num_batched_tokens"]
    workload = random_workload(gen, alone, 12, block_size, chunk)
    # Request i joins at arrivals[i] (a step), or, when it reuses the id of an earlier request,
    # once that one has finished; some are aborted a few steps after they join.
    ids = [f"r{i}" for i in range(len(workload))]
    for i in (3, 7, 10):
        ids[i] = ids[i - 2]
    arrivals = [0 if gen.random() < 0.4 else gen.randint(1, 12) for _ in workload]
    abort_after = {i: gen.randint(0, 6) for i in gen.sample(range(len(workload)), 3)}

    engine = make_engine(**kwargs)
    counts = {"preempted": 0, "ahead": 0}
    schedule, execute = engine.scheduler.schedule, engine.executor.runner.execute

    def counted_schedule():
        out = schedule()
        counts["preempted"] += len(out.preempted_request_ids)
        return out

    def counted_execute(step):
        counts["ahead"] += step.input_ids is None
        return execute(step)

    engine.scheduler.schedule = counted_schedule
    engine.executor.runner.execute = counted_execute
    try:
        live, joined, finals, abort_at, step = {}, {}, {}, {}, 0
        while len(finals) < len(workload):
            for i, request_id in enumerate(ids):
                reuses = ids.index(request_id) < i
                due = (i - 2 in finals) if reuses else arrivals[i] == step
                if i not in joined and due and request_id not in live:
                    engine.add_request(request_id, *workload[i])
                    live[request_id], joined[i] = i, step
                    if i in abort_after:
                        abort_at[i] = step + abort_after[i]
            for i, at in abort_at.items():
                if at == step and live.get(ids[i]) == i:
                    for out in engine.abort_request(ids[i]):
                        finals[live.pop(out.request_id)] = out
            for out in engine.step():
                if out.finished:
                    finals[live.pop(out.request_id)] = out
            step += 1
            assert step < 2000
        assert_drained(engine)
    finally:
        engine.shutdown()

    # The workloads are chosen so that these paths run.
    assert counts["preempted"]
    assert bool(counts["ahead"]) == (name == "async")
    for i, (prompt, params) in enumerate(workload):
        got, want = finals[i], alone(prompt, params)
        what = f"request {i} ({len(prompt)} prompt tokens, {params})"
        aborted = any(c.finish_reason == "abort" for c in got.outputs)
        assert len(got.outputs) == len(want.outputs), what
        for g, w in zip(got.outputs, want.outputs, strict=True):
            if aborted:  # what it produced before the abort, as alone
                assert g.token_ids == w.token_ids[: len(g.token_ids)], what
                continue
            assert g.token_ids == w.token_ids, what
            assert (g.finish_reason, g.stop_reason) == (w.finish_reason, w.stop_reason), what
            assert g.text == w.text, what
            assert_close_logprobs(g.logprobs, w.logprobs, f"{what} logprobs")
        if not aborted:
            assert_close_logprobs(got.prompt_logprobs, want.prompt_logprobs, f"{what} prompt")
    assert any(c.finish_reason == "abort" for out in finals.values() for c in out.outputs)
    assert any(
        len(out.prompt_token_ids) + len(c.token_ids) == MAX_MODEL_LEN
        for out in finals.values()
        for c in out.outputs
    )
