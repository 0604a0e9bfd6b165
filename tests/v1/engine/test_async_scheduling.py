"""Asynchronous scheduling end to end (tiny model, CPU, torch reference kernels): the same
outputs as one step at a time, for every way a sequence can end while its next step is already
launched (stop token, stop string, length, abort), with seeded sampling and logprobs; and the
steps launched ahead really run."""

import pytest

from vllm.engine.arg_utils import EngineArgs
from vllm.sampling_params import RequestOutputKind, SamplingParams
from vllm.v1.engine.llm_engine import LLMEngine

PROMPTS = {"a": [3, 1, 4, 1, 5], "b": [9, 2, 6], "c": [5, 3, 5, 8, 9, 7, 9], "d": [2, 7]}


@pytest.fixture(scope="module", autouse=True)
def reference_kernels(torch_reference_kernels):
    """Scheduling is under test, not kernels."""


def make_engine(async_scheduling: bool) -> LLMEngine:
    args = EngineArgs(
        model="kimi-k3-tiny", max_num_seqs=8, max_num_batched_tokens=64, block_size=4,
        kv_cache_memory=64 << 20, async_scheduling=async_scheduling,
    )  # fmt: skip
    return LLMEngine.from_engine_args(args)


def run(engine: LLMEngine, params: dict[str, SamplingParams], abort_at: dict[int, str]) -> dict:
    """Every request to its end; `abort_at[k]` is aborted after the k-th step() call. Returns the
    final outputs and, per request, the (step call, tokens) of each cumulative output."""
    for rid, p in params.items():
        engine.add_request(rid, PROMPTS[rid[0]], p)
    finals, seen, calls = {}, {}, 0
    while engine.has_unfinished_requests():
        for out in engine.step():
            seen.setdefault(out.request_id, []).append((calls, len(out.outputs[0].token_ids)))
            if out.finished:
                finals[out.request_id] = out
        calls += 1
        if calls in abort_at:
            for out in engine.abort_request(abort_at[calls]):
                finals[out.request_id] = out
    return {
        rid: [(c.token_ids, c.text, c.finish_reason, c.stop_reason, c.logprobs)
              for c in out.outputs]
        for rid, out in finals.items()
    }, seen  # fmt: skip


def both(params: dict[str, SamplingParams], abort_at: dict[int, str] | None = None):
    """(async, sync) results, and how many steps the async engine launched ahead."""
    results, ahead = [], 0
    for flag in (True, False):
        engine = make_engine(flag)
        runner = engine.executor.runner
        execute = runner.execute
        launched_ahead = []

        def spy(step, execute=execute, launched_ahead=launched_ahead):
            launched_ahead.append(step.input_ids is None)
            return execute(step)

        runner.execute = spy
        try:
            results.append(run(engine, params, abort_at or {}))
            kv = engine.kv_cache_manager
            assert kv.num_free_blocks == kv.initial_num_free_blocks
            assert kv.num_free_kda_slots == kv.initial_num_free_kda_slots
        finally:
            engine.shutdown()
        if flag:
            ahead = sum(launched_ahead)
        else:
            assert not any(launched_ahead)
    return results[0], results[1], ahead


def test_stop_tokens_stop_strings_and_lengths_as_one_step_at_a_time():
    # Learn what greedy decoding makes, then stop each sequence in mid-run a different way.
    free = {rid: SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True) for rid in "ab"}
    (finals, _), _, _ = both(free)
    a_tokens, b_tokens = finals["a"][0][0], finals["b"][0][0]
    stop_token = a_tokens[4]
    stop_text = finals["b"][0][1][len(finals["b"][0][1]) // 2 :][:2]
    assert stop_text.strip() and stop_token not in a_tokens[:4]
    params = {
        "a": SamplingParams(temperature=0.0, max_tokens=12, stop_token_ids=[stop_token]),
        "b": SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True, stop=[stop_text]),
        "c": SamplingParams(temperature=0.0, max_tokens=3, ignore_eos=True),
        "d": SamplingParams(temperature=0.0, max_tokens=9, ignore_eos=True),
    }
    (got, _), (want, _), ahead = both(params)
    assert got == want
    assert got["a"][0][2:4] == ("stop", stop_token) and len(got["a"][0][0]) == 5
    assert got["b"][0][2] == "stop" and len(got["b"][0][0]) < len(b_tokens)
    assert [got[r][0][2] for r in "cd"] == ["length", "length"]
    assert ahead >= 3


def test_seeded_sampling_logprobs_and_n_as_one_step_at_a_time():
    params = {
        "a": SamplingParams(temperature=0.8, top_k=20, seed=7, n=2, max_tokens=8, logprobs=2,
                            ignore_eos=True),
        "c": SamplingParams(temperature=1.0, top_p=0.9, seed=3, max_tokens=8, ignore_eos=True,
                            output_kind=RequestOutputKind.CUMULATIVE),
    }  # fmt: skip
    # All end together: a row kept for a sequence that ended would change the other rows' batch,
    # and with it the last bits of their logprobs (CPU matmuls block by batch size).
    (got, got_seen), (want, want_seen), ahead = both(params)
    assert got == want
    assert all(len(c[0]) == 8 and len(c[4]) == 8 for c in got["a"])
    # Streamed outputs come from the same step() calls: one step's tokens per call.
    assert got_seen == want_seen
    assert ahead >= 3


def test_abort_while_the_next_step_is_in_flight():
    params = {r: SamplingParams(temperature=0.0, max_tokens=10, ignore_eos=True) for r in "abc"}
    (got, _), (want, _), ahead = both(params, abort_at={4: "b"})
    assert got == want
    assert got["b"][0][2] == "abort" and 0 < len(got["b"][0][0]) < 10
    assert ahead >= 3


@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True, repetition_penalty=1.5),
        SamplingParams(temperature=0.0, max_tokens=8, min_tokens=8),
    ],
    ids=["repetition_penalty", "min_tokens"],
)
def test_no_step_ahead_while_sampling_depends_on_the_tokens(params):
    """A penalty's seen tokens and a min_tokens suppression are built from the token history,
    which lacks the step in flight's token: such rows are sampled one step at a time."""
    (got, _), (want, _), ahead = both({"a": params, "b": params})
    assert got == want
    assert ahead == 0


def test_an_error_while_scheduling_ahead_fails_the_step_and_the_engine_goes_on(monkeypatch):
    engine = make_engine(True)
    try:
        params = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)
        engine.add_request("a", PROMPTS["a"], params)
        engine.step()

        def broken(step):
            raise RuntimeError("no room")

        monkeypatch.setattr(engine.scheduler, "schedule_ahead", broken)
        with pytest.raises(RuntimeError, match="no room"):
            engine.step()
        assert not engine.has_unfinished_requests() and not engine.step_in_flight
        monkeypatch.undo()
        engine.add_request("b", PROMPTS["b"], params)
        finals = []
        while engine.has_unfinished_requests():
            finals += [o for o in engine.step() if o.finished]
        assert [(o.request_id, len(o.outputs[0].token_ids)) for o in finals] == [("b", 6)]
        kv = engine.kv_cache_manager
        assert kv.num_free_blocks == kv.initial_num_free_blocks
    finally:
        engine.shutdown()


def test_a_step_launched_ahead_needs_the_last_sampled_rows():
    engine = make_engine(True)
    try:
        engine.add_request("a", PROMPTS["a"], SamplingParams(temperature=0.0, max_tokens=6))
        engine.step()  # the prefill: nothing launched ahead of it
        assert not engine.step_in_flight
        engine.step()  # the first decode, with the second launched ahead
        assert engine.step_in_flight
        runner = engine.executor.runner
        runner.last_sampled = runner.last_sampled[:0]
        with pytest.raises(ValueError, match="last sampled rows"):
            engine.step()  # launching the third finds no sampled row to feed it
    finally:
        engine.shutdown()


@pytest.mark.parametrize("end", ["stop_token", "abort"])
def test_a_step_launched_ahead_is_dropped_once_its_sequences_end(end):
    """A sequence that ends on a stop token (or is aborted) while its next step is in flight
    leaves nothing in flight and nothing scheduled: the step is forgotten at once, not held
    until a later step() call."""
    engine = make_engine(True)
    try:
        free = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
        engine.add_request("probe", PROMPTS["a"], free)
        tokens = []
        while engine.has_unfinished_requests():
            tokens += [o.outputs[0].token_ids for o in engine.step() if o.finished]
        stop = tokens[0][3]
        assert stop not in tokens[0][:3]
        params = SamplingParams(temperature=0.0, max_tokens=8, stop_token_ids=[stop])
        engine.add_request("a", PROMPTS["a"], params if end == "stop_token" else free)
        for _ in range(3):
            engine.step()
        assert engine.step_in_flight
        if end == "abort":
            engine.abort_request("a")
        else:
            while engine.has_unfinished_requests():
                engine.step()
        assert not engine.has_unfinished_requests()
        assert not engine.step_in_flight and not engine.scheduler._pending
        kv = engine.kv_cache_manager
        assert kv.num_free_blocks == kv.initial_num_free_blocks
        assert kv.num_free_kda_slots == kv.initial_num_free_kda_slots
        engine.add_request("b", PROMPTS["b"], free)
        finals = []
        while engine.has_unfinished_requests():
            finals += [o for o in engine.step() if o.finished]
        assert [len(o.outputs[0].token_ids) for o in finals] == [8]
    finally:
        engine.shutdown()


def test_on_by_default_for_cuda_at_any_tp_size():
    def resolved(**kwargs) -> bool:
        config = EngineArgs(model="kimi-k3-tiny", **kwargs).create_engine_config()
        return config.scheduler_config.async_scheduling

    assert not resolved()  # the CPU: each forward runs before its launch returns
    assert resolved(async_scheduling=True)
    assert not resolved(tensor_parallel_size=2)
    assert resolved(tensor_parallel_size=2, async_scheduling=True)
    # The default on a GPU host, whose device this CPU test cannot ask for.
    assert EngineArgs(model="kimi-k3-tiny", tensor_parallel_size=2)._async_scheduling("cuda")
    with pytest.raises(ValueError, match="bool or None"):
        resolved(async_scheduling=1)
