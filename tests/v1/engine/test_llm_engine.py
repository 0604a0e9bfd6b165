"""The engine end to end on the built-in tiny models (CPU, torch reference kernels):

- greedy outputs of a batch of prompts of different lengths equal a one-sequence-at-a-time greedy
  decode through the model itself (which the model tests tie to transformers), also with chunked
  prefill forced small, preemption forced by a tiny block pool, requests arriving mid-run, aborts;
- the cache counters return to their initial values after every workload;
- a randomized soak of 200 requests.
"""

import logging
import random
from dataclasses import replace

import pytest
from model_reference import reference_decode

from vllm.engine import arg_utils
from vllm.engine.arg_utils import EngineArgs
from vllm.model_executor.model_loader.builtin import resolve_model
from vllm.sampling_params import RequestOutputKind, SamplingParams
from vllm.v1.engine.llm_engine import LLMEngine

MODEL = "kimi-k3-tiny"


@pytest.fixture(scope="module", autouse=True)
def reference_kernels(torch_reference_kernels):
    """The engine tests check scheduling, not kernels: run the torch references (the Triton
    interpreter would make every decode step seconds long)."""


def make_engine(**kwargs) -> LLMEngine:
    args = dict(model=MODEL, max_num_seqs=8, max_num_batched_tokens=64, block_size=4,
                kv_cache_memory=64 << 20)  # fmt: skip
    args.update(kwargs)
    return LLMEngine.from_engine_args(EngineArgs(**args))


def prompts_of(lengths: list[int], seed: int = 0) -> list[list[int]]:
    gen = random.Random(seed)
    return [[gen.randrange(0, 256) for _ in range(n)] for n in lengths]


def run_all(engine: LLMEngine, requests: dict[str, tuple[list[int], SamplingParams]],
            arrivals: dict[int, list[str]] | None = None,
            aborts: dict[int, list[str]] | None = None) -> dict:  # fmt: skip
    """Drive `engine` until every request finished; requests in `arrivals[step]` join at that
    step (the rest at step 0), `aborts[step]` are aborted then. Returns the final outputs."""
    arrivals = arrivals or {}
    late = {r for ids in arrivals.values() for r in ids}
    for request_id, (prompt, params) in requests.items():
        if request_id not in late:
            engine.add_request(request_id, prompt, params)
    finals, step = {}, 0
    while engine.has_unfinished_requests() or step <= max(arrivals, default=0):
        for request_id in arrivals.get(step, []):
            engine.add_request(request_id, *requests[request_id])
        for out in engine.abort_request((aborts or {}).get(step, [])):
            finals[out.request_id] = out
        for out in engine.step():
            if out.finished:
                finals[out.request_id] = out
        step += 1
    return finals


def assert_cache_free(engine: LLMEngine) -> None:
    kv = engine.kv_cache_manager
    assert kv.num_free_blocks == kv.initial_num_free_blocks
    assert kv.num_free_kda_slots == kv.initial_num_free_kda_slots
    assert not engine.has_unfinished_requests()


GREEDY = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)


def assert_runs_the_reference(
    engine: LLMEngine, prompts: list[list[int]], expected: dict[str, list[int]]
) -> None:
    """The engine is not stuck after a failure: `prompts` run greedily and give the reference
    tokens, and the cache is free again."""
    requests = {str(i): (p, GREEDY) for i, p in enumerate(prompts)}
    finals = run_all(engine, requests)
    assert {r: o.outputs[0].token_ids for r, o in finals.items()} == expected
    assert_cache_free(engine)


LENGTHS = [1, 5, 17, 9, 30, 2]


@pytest.fixture(scope="module")
def expected():
    engine = make_engine()
    try:
        return {
            str(i): reference_decode(engine, p, GREEDY.max_tokens)[0]
            for i, p in enumerate(prompts_of(LENGTHS))
        }
    finally:
        engine.shutdown()


@pytest.mark.parametrize(
    "name, kwargs",
    [
        ("batched", {}),
        ("chunked_prefill", {"max_num_batched_tokens": 8}),
        (
            "preemption",
            {"num_gpu_blocks_override": 14, "kv_cache_memory": None, "max_model_len": 48},
        ),
        ("one_seq_at_a_time", {"max_num_seqs": 1}),
    ],
)
def test_greedy_batch_equals_one_sequence_reference(expected, name, kwargs):
    engine = make_engine(**kwargs)
    try:
        requests = {str(i): (p, GREEDY) for i, p in enumerate(prompts_of(LENGTHS))}
        preempted = []
        schedule = engine.scheduler.schedule

        def spy():
            out = schedule()
            preempted.extend(out.preempted_request_ids)
            return out

        engine.scheduler.schedule = spy
        finals = run_all(engine, requests)
        assert {r: o.outputs[0].token_ids for r, o in finals.items()} == expected
        assert bool(preempted) == (name == "preemption")
        assert_cache_free(engine)
    finally:
        engine.shutdown()


def test_requests_arriving_mid_run_and_aborts(expected):
    engine = make_engine()
    try:
        requests = {str(i): (p, GREEDY) for i, p in enumerate(prompts_of(LENGTHS))}
        requests["gone"] = (prompts_of([12], seed=5)[0], SamplingParams(max_tokens=50))
        requests["late_gone"] = (prompts_of([3], seed=6)[0], SamplingParams(max_tokens=50))
        finals = run_all(
            engine, requests, arrivals={2: ["3", "4"], 3: ["late_gone"], 5: ["5"]},
            aborts={1: ["gone"], 4: ["late_gone"]},
        )  # fmt: skip
        assert finals["gone"].outputs[0].finish_reason == "abort"
        assert finals["late_gone"].outputs[0].finish_reason == "abort"
        got = {r: o.outputs[0].token_ids for r, o in finals.items() if "gone" not in r}
        assert got == expected
        assert_cache_free(engine)
    finally:
        engine.shutdown()


def test_add_request_refuses_what_cannot_fit():
    engine = make_engine(max_model_len=32)
    try:
        with pytest.raises(ValueError, match="max_model_len 32"):
            engine.add_request("a", [1] * 32)
        for max_tokens in (None, 10):
            with pytest.raises(ValueError, match="min_tokens 8 does not fit.*at most 7"):
                params = SamplingParams(max_tokens=max_tokens, min_tokens=8)
                engine.add_request("b", [1] * 25, params)
        # A min_tokens of exactly the room left fits.
        engine.add_request("f", [1] * 25, SamplingParams(max_tokens=None, min_tokens=7))
        engine.abort_request("f")
        with pytest.raises(ValueError, match="outside the vocabulary"):
            engine.add_request("c", [1, 100000])
        # A bias of 0 changes nothing, but on no token of the vocabulary the request is wrong.
        vocab = engine.config.model_config.vocab_size
        for key in ("100000", -1, str(vocab)):
            with pytest.raises(ValueError, match=r"logit_bias token ids outside the vocabulary"):
                engine.add_request("c", [1, 2], SamplingParams(logit_bias={key: 0}))
        engine.add_request("g", [1, 2], SamplingParams(logit_bias={"0": 0, str(vocab - 1): 0}))
        engine.abort_request("g")
        with pytest.raises(ValueError, match="empty"):
            engine.add_request("d", [])
        engine.add_request("e", [1, 2], SamplingParams(max_tokens=2))
        with pytest.raises(ValueError, match="already in use"):
            engine.add_request("e", [1, 2])
        engine.abort_request("e")
        assert_cache_free(engine)
    finally:
        engine.shutdown()


def test_max_tokens_past_the_room_left_stop_at_max_model_len():
    """As upstream, a reply stops at max_model_len with finish_reason "length": a max_tokens
    beyond the room its prompt leaves fails neither it nor the prompts batched with it."""
    engine = make_engine(max_model_len=32)
    try:
        params = SamplingParams(temperature=0.0, max_tokens=10, ignore_eos=True)
        sampled = SamplingParams(n=2, seed=3, max_tokens=10, ignore_eos=True)
        prompts = prompts_of([25, 5])
        finals = run_all(
            engine,
            {"long": (prompts[0], params), "short": (prompts[1], params),
             "long_n2": (prompts[0], sampled)},
        )  # fmt: skip
        for request_id, expected_tokens in (("long", 7), ("short", 10), ("long_n2", 7)):
            for completion in finals[request_id].outputs:
                assert len(completion.token_ids) == expected_tokens, request_id
                assert completion.finish_reason == "length"
        assert len(finals["long_n2"].outputs) == 2
        assert_cache_free(engine)
    finally:
        engine.shutdown()


def test_skip_tokenizer_init_runs_on_token_ids(expected, tmp_path):
    engine = make_engine(skip_tokenizer_init=True)
    try:
        assert engine.tokenizer is None
        requests = {str(i): (p, GREEDY) for i, p in enumerate(prompts_of(LENGTHS))}
        finals = run_all(engine, requests)
        assert {r: o.outputs[0].token_ids for r, o in finals.items()} == expected
        assert all(o.outputs[0].text == "" for o in finals.values())
        with pytest.raises(ValueError, match="needs a tokenizer"):
            engine.add_request("text", "hello")
        with pytest.raises(ValueError, match="stop strings need a tokenizer"):
            engine.add_request("stop", [1, 2], SamplingParams(stop=["x"]))
        assert_cache_free(engine)
    finally:
        engine.shutdown()
    with pytest.raises(ValueError, match="exclude each other"):
        EngineArgs(model=MODEL, tokenizer=MODEL, skip_tokenizer_init=True).create_engine_config()
    # A folder without tokenizer files names both ways out.
    (tmp_path / "config.json").write_bytes((resolve_model(MODEL)[0] / "config.json").read_bytes())
    with pytest.raises(ValueError, match="skip_tokenizer_init"):
        EngineArgs(model=str(tmp_path), load_format="dummy").create_engine_config()
    EngineArgs(
        model=str(tmp_path), skip_tokenizer_init=True, load_format="dummy"
    ).create_engine_config()
    # Nor has it weights: refused with the other arguments, not once loading has begun.
    with pytest.raises(ValueError, match=r"^load_format 'auto': no safetensors checkpoint in "):
        EngineArgs(model=str(tmp_path), skip_tokenizer_init=True).create_engine_config()


@pytest.mark.parametrize(
    "block_size, warned", [(100_000, True), (65, True), (64, False), (16, False)]
)
def test_blocks_longer_than_any_sequence_are_warned_of(block_size, warned, caplog):
    """A block past max_model_len (64 here) is never filled: accepted, with the waste named (the
    default 16 is not warned of where max_model_len is shorter)."""
    log = logging.getLogger(arg_utils.__name__)
    log.addHandler(caplog.handler)
    try:
        with caplog.at_level(logging.WARNING, logger=arg_utils.__name__):
            for max_model_len in (64, 8):
                EngineArgs(
                    model=MODEL, skip_tokenizer_init=True, max_model_len=max_model_len,
                    block_size=block_size if max_model_len == 64 else 16,
                ).create_engine_config()  # fmt: skip
    finally:
        log.removeHandler(caplog.handler)
    message = f"block_size {block_size} exceeds max_model_len 64: each sequence takes one block"
    assert (message in caplog.text) == warned, caplog.text
    assert "max_model_len 8" not in caplog.text
    if warned:
        assert f"at least {block_size - 64} tokens' cache stay unused" in caplog.text


@pytest.mark.parametrize("value, warned", [(True, True), (False, False), (None, False)])
def test_prefix_caching_asked_for_is_warned_to_have_no_effect(value, warned, caplog):
    """Upstream's default is on, and outputs are the same without a cache: on is taken with a
    warning that nothing is cached, off and unset are silent."""
    log = logging.getLogger(arg_utils.__name__)
    log.addHandler(caplog.handler)
    try:
        with caplog.at_level(logging.WARNING, logger=arg_utils.__name__):
            EngineArgs(
                model=MODEL, skip_tokenizer_init=True, enable_prefix_caching=value
            ).create_engine_config()
    finally:
        log.removeHandler(caplog.handler)
    said = "enable_prefix_caching has no effect: vllm-k3 has no prefix cache"
    assert (said in caplog.text) == warned, caplog.text


def test_randomized_soak():
    """200 requests of random lengths and sampling parameters, random arrivals and aborts."""
    gen = random.Random(1234)
    engine = make_engine(max_num_seqs=16, max_num_batched_tokens=48, num_gpu_blocks_override=60,
                         kv_cache_memory=None, max_model_len=96)  # fmt: skip
    try:
        pending = []
        for i in range(200):
            prompt = [gen.randrange(0, 300) for _ in range(gen.randint(1, 40))]
            params = SamplingParams(
                n=gen.choice([1, 1, 1, 2]),
                temperature=gen.choice([0.0, 0.7, 1.0]),
                top_k=gen.choice([0, 5]),
                top_p=gen.choice([1.0, 0.9]),
                seed=gen.choice([None, i]),
                max_tokens=gen.randint(1, 20),
                stop=gen.choice([None, ["a"]]),
                logprobs=gen.choice([None, 2]),
            )
            pending.append((str(i), prompt, params))
        aborted, finished, step = set(), {}, 0
        while pending or engine.has_unfinished_requests():
            for _ in range(gen.randint(0, 4)):
                if pending:
                    request_id, prompt, params = pending.pop(0)
                    engine.add_request(request_id, prompt, params)
            if gen.random() < 0.1 and engine.output_processor.requests:
                victim = gen.choice(sorted(engine.output_processor.requests))
                engine.abort_request(victim)
                aborted.add(victim)
            for out in engine.step():
                if out.finished:
                    finished[out.request_id] = out
            step += 1
            assert step < 5000
        assert set(finished) | aborted == {str(i) for i in range(200)}
        for request_id, out in finished.items():
            if request_id in aborted:
                continue
            for completion in out.outputs:
                assert completion.finish_reason in ("stop", "length")
        assert_cache_free(engine)
    finally:
        engine.shutdown()


def test_final_only_requests_return_just_the_streamed_final_output():
    """A FINAL_ONLY request appears once, finished, with the final output its CUMULATIVE twin
    streams: n > 1 completions finishing at different steps (one by a stop string), logprobs."""
    base = SamplingParams(n=2, temperature=1.0, seed=7, max_tokens=8, logprobs=1, ignore_eos=True)
    engine = make_engine()
    try:
        (probe,) = run_all(engine, {"p": (prompts_of([5])[0], base)}).values()
        # A stop string from completion 0's text: it ends that one early, not completion 1.
        text = probe.outputs[0].text
        assert len(text) >= 3 and text[1:3] not in probe.outputs[1].text
        params = replace(base, stop=[text[1:3]])
        # n=1: the stop string finishes the request; n=2: the other completion's length does.
        for p, reasons in ((params, ["stop", "length"]), (replace(params, n=1), ["stop"])):
            finals = {}
            for kind in RequestOutputKind:
                engine.add_request(kind.name, prompts_of([5])[0], replace(p, output_kind=kind))
                seen = []
                while engine.has_unfinished_requests():
                    seen += engine.step()
                assert [out.request_id for out in seen] == [kind.name] * len(seen)
                assert seen[-1].finished
                assert (len(seen) == 1) == (kind is RequestOutputKind.FINAL_ONLY)
                finals[kind] = replace(seen[-1], request_id="x")
            cumulative, final = finals.values()
            assert [c.finish_reason for c in final.outputs] == reasons
            assert final == cumulative
        assert_cache_free(engine)
    finally:
        engine.shutdown()


def test_logprobs_past_max_logprobs_are_refused_and_minus_one_allows_the_vocabulary():
    """A request listing the whole vocabulary would detokenize it on the engine thread at every
    token, stalling the others: the engine caps the count (20 by default, -1: no cap). A
    request's -1 is upstream's "the whole vocabulary", held to the same cap: refused by default
    with what to do, listing every token under max_logprobs=-1."""
    engine = make_engine()
    try:
        vocab = engine.config.model_config.vocab_size
        for name in ("logprobs", "prompt_logprobs"):
            with pytest.raises(ValueError, match=f"{name} 21 exceeds 20, the most a request may"):
                engine.add_request(name, [1, 2, 3], SamplingParams(**{name: 21}))
            with pytest.raises(
                ValueError,
                match=rf"{name} -1 asks for the whole vocabulary \({vocab} tokens\), but this "
                r"engine allows at most 20 \(max_logprobs\); start it with max_logprobs=-1",
            ):
                engine.add_request(name, [1, 2, 3], SamplingParams(**{name: -1}))
        assert not engine.has_unfinished_requests()
        params = SamplingParams(max_tokens=1, logprobs=20, prompt_logprobs=20)
        (out,) = run_all(engine, {"at the cap": ([1, 2, 3], params)}).values()
        assert len(out.outputs[0].logprobs[0]) in (20, 21)  # the sampled token may be in the top
    finally:
        engine.shutdown()
    engine = make_engine(max_logprobs=-1)
    try:
        vocab = engine.config.model_config.vocab_size
        params = SamplingParams(max_tokens=1, prompt_logprobs=vocab)
        (out,) = run_all(engine, {"whole vocabulary": ([1, 2, 3], params)}).values()
        assert [len(p) for p in out.prompt_logprobs[1:]] == [vocab, vocab]
        # -1 is the same request, for the sampled tokens too (each of n), as upstream.
        params = SamplingParams(max_tokens=2, n=2, logprobs=-1, prompt_logprobs=-1, seed=1)
        (minus_one,) = run_all(engine, {"-1": ([1, 2, 3], params)}).values()
        # (Batched with the second completion's prefill: equal up to rounding.)
        for got, want in zip(minus_one.prompt_logprobs[1:], out.prompt_logprobs[1:], strict=True):
            assert got.keys() == want.keys()
            assert [got[t].logprob for t in want] == pytest.approx(
                [lp.logprob for lp in want.values()], abs=1e-5
            )
        for completion in minus_one.outputs:
            assert [len(p) for p in completion.logprobs] == [vocab, vocab]
            for token, position in zip(completion.token_ids, completion.logprobs, strict=True):
                # The whole vocabulary is there: the sampled token's rank counts it all.
                chosen = position[token]
                above = sum(lp.logprob > chosen.logprob for lp in position.values())
                assert chosen.rank == 1 + above
    finally:
        engine.shutdown()


def test_a_second_shutdown_does_nothing(monkeypatch):
    """Not even unfreezing the heap: an old engine collected after a new one started (its name
    rebound) would undo the new engine's frozen start-up heap."""
    from vllm.v1.engine import llm_engine

    engine = make_engine()
    calls = []
    monkeypatch.setattr(llm_engine, "unfreeze_heap", lambda: calls.append("unfreeze"))
    engine.shutdown()
    engine.shutdown()
    assert calls == ["unfreeze"]


def test_sampling_params_beyond_the_vocabulary_are_refused_at_add_request():
    engine = make_engine(max_logprobs=-1)
    try:
        vocab = engine.config.model_config.vocab_size
        cases = {
            "stop_token_ids": SamplingParams(stop_token_ids=[vocab], min_tokens=1),
            "logprobs": SamplingParams(logprobs=vocab + 1),
            "prompt_logprobs": SamplingParams(prompt_logprobs=vocab + 1),
        }
        for name, params in cases.items():
            with pytest.raises(ValueError, match=name):
                engine.add_request(name, [1, 2, 3], params)
        assert not engine.has_unfinished_requests()
    finally:
        engine.shutdown()


def test_max_tokens_zero_ends_by_length_even_when_its_dropped_token_is_a_stop_token():
    """max_tokens=0 scores the prompt and drops the one token sampled to end the prefill: no
    token is generated, so nothing can have stopped on one, even when the dropped token is a
    stop token (it reported finish_reason "stop" with that unseen token as its stop_reason)."""
    engine = make_engine()
    try:
        prompt = prompts_of([5])[0]
        greedy = SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True)
        (first,) = run_all(engine, {"probe": (prompt, greedy)})["probe"].outputs[0].token_ids
        scoring = {
            "stop_token": SamplingParams(temperature=0.0, max_tokens=0, stop_token_ids=[first]),
            "plain": SamplingParams(temperature=0.0, max_tokens=0, ignore_eos=True),
        }
        finals = run_all(engine, {name: (prompt, p) for name, p in scoring.items()})
        for name in scoring:
            out = finals[name].outputs[0]
            assert (out.token_ids, out.text) == ([], ""), name
            assert (out.finish_reason, out.stop_reason) == ("length", None), name
        assert_cache_free(engine)
    finally:
        engine.shutdown()


def test_a_failed_step_finishes_its_requests_as_errors_and_the_engine_goes_on(expected):
    engine = make_engine()
    try:
        prompts = prompts_of(LENGTHS)
        engine.add_request("doomed", prompts[0], GREEDY)
        runner = engine.executor.runner
        execute = runner.execute

        def fail(step):
            raise RuntimeError("out of memory (injected)")

        runner.execute = fail
        with pytest.raises(RuntimeError, match="injected"):
            engine.step()
        runner.execute = execute
        assert "doomed" not in engine.output_processor.requests
        assert_cache_free(engine)
        # The scheduler is not stuck: the next requests run and give the reference tokens.
        assert_runs_the_reference(engine, prompts, expected)
    finally:
        engine.shutdown()


@pytest.mark.parametrize("async_scheduling", [False, True], ids=["sync", "async"])
@pytest.mark.parametrize("error", [KeyboardInterrupt, ValueError])
def test_a_step_that_fails_before_it_is_recorded_leaves_the_engine_usable(
    expected, async_scheduling, error
):
    """An error (or Ctrl-C) after a step's tokens are read back but before the scheduler records
    them fails the step like an error in its forward: had it stayed scheduled, every later
    schedule() would have refused."""
    engine = make_engine(async_scheduling=async_scheduling)
    try:
        prompts = prompts_of(LENGTHS)
        engine.add_request("doomed", prompts[0], GREEDY)
        scheduler = engine.scheduler
        update, calls = scheduler.update_from_output, []

        def fails_at_the_third(*args, **kwargs):  # the prefill, a decode, then this decode
            calls.append(args[0])
            if len(calls) == 3:
                raise error("injected")
            return update(*args, **kwargs)

        scheduler.update_from_output = fails_at_the_third
        with pytest.raises(error, match="injected"):
            for _ in range(3):
                engine.step()
        del scheduler.update_from_output
        assert not scheduler.is_scheduled(calls[-1]) and not engine.step_in_flight
        assert "doomed" not in engine.output_processor.requests
        assert_cache_free(engine)
        assert_runs_the_reference(engine, prompts, expected)
    finally:
        engine.shutdown()


@pytest.mark.parametrize("async_scheduling", [False, True], ids=["sync", "async"])
def test_an_error_after_the_step_was_recorded_propagates_and_an_abort_cleans_up(
    expected, async_scheduling
):
    """Once the scheduler has recorded the step, the error is the caller's (as `LLM.generate`
    aborts its requests): it is raised as it was, not hidden behind a refusal to cancel a step
    no longer scheduled."""
    engine = make_engine(async_scheduling=async_scheduling)
    try:
        prompts = prompts_of(LENGTHS)
        engine.add_request("doomed", prompts[0], GREEDY)
        scheduler = engine.scheduler
        update, calls = scheduler.update_from_output, []

        def fails_after_the_third(*args, **kwargs):
            calls.append(args[0])
            finished = update(*args, **kwargs)
            if len(calls) == 3:
                raise KeyboardInterrupt
            return finished

        scheduler.update_from_output = fails_after_the_third
        with pytest.raises(KeyboardInterrupt):
            for _ in range(3):
                engine.step()
        del scheduler.update_from_output
        assert not scheduler.is_scheduled(calls[-1])
        engine.abort_request("doomed")
        assert_cache_free(engine)
        assert_runs_the_reference(engine, prompts, expected)
    finally:
        engine.shutdown()


def test_nothing_in_the_engine_keeps_an_ended_request_alive():
    """Every way a sequence ends (length, stop token, abort mid-decode, a seeded n > 1 request
    aborted) leaves no reference to it behind once the engine is idle."""
    import gc
    import weakref

    engine = make_engine(async_scheduling=False)
    try:
        prompts = prompts_of([7, 12, 5])
        engine.add_request("len", prompts[0], GREEDY)
        engine.add_request("seeded", prompts[1], SamplingParams(n=2, seed=1, max_tokens=20))
        every_token = list(range(engine.config.model_config.vocab_size))
        stop = SamplingParams(temperature=0.0, max_tokens=20, min_tokens=2,
                              stop_token_ids=every_token)  # fmt: skip
        engine.add_request("stop", prompts[2], stop)
        refs = [weakref.ref(r) for r in engine.scheduler.requests.values()]
        finals = {}
        for _ in range(2):
            finals.update((o.request_id, o) for o in engine.step() if o.finished)
        engine.abort_request("seeded")
        finals.update(run_all(engine, {}))
        assert finals["stop"].outputs[0].finish_reason == "stop"
        assert len(finals["stop"].outputs[0].token_ids) == 2  # min_tokens
        assert_cache_free(engine)
        gc.collect()
        assert [r() for r in refs if r() is not None] == []
    finally:
        engine.shutdown()


def test_the_startup_heap_is_frozen_until_shutdown():
    import gc

    def collectable(obj) -> bool:  # in the collector's generations (not frozen)
        return any(o is obj for o in gc.get_objects())

    gc.unfreeze()
    engine = make_engine()
    try:
        assert gc.get_freeze_count() > 1000
        assert not collectable(engine.scheduler) and not collectable(engine.executor.runner)
    finally:
        engine.shutdown()
    assert gc.get_freeze_count() == 0 and collectable(engine.scheduler)


def test_an_engine_dropped_without_shutdown_is_collected_by_the_next_start():
    import gc
    import weakref

    first = make_engine()
    ref = weakref.ref(first.scheduler)
    first.scheduler.cycle = first.scheduler  # only the collector frees a cycle
    del first
    second = make_engine()
    try:
        assert ref() is None
    finally:
        second.shutdown()
    assert gc.get_freeze_count() == 0


def test_running_requests_keep_their_prompts_out_of_the_collectors_walk():
    """Every collection walks each tracked list item by item: a running request's prompt is kept
    where it does not (docs/performance.md, "Eleventh run"), and the outputs still carry
    lists."""
    import gc

    engine = make_engine()
    try:
        params = replace(GREEDY, max_tokens=6, output_kind=RequestOutputKind.FINAL_ONLY)
        engine.add_request("r", prompts_of([40])[0], params)
        for _ in range(3):
            engine.step()
        gc.collect()
        (request,) = engine.scheduler.running
        state = engine.output_processor.requests["r"]
        assert request.num_tokens > 40 and len(request.output_token_ids) > 0
        # Tuples of ints, untracked once a collection has seen them; the growing output stays a
        # list.
        assert not gc.is_tracked(request.prompt_token_ids)
        assert not gc.is_tracked(state.prompt_token_ids)
        assert request.token_ids(0, request.num_tokens) == [
            *prompts_of([40])[0],
            *request.output_token_ids,
        ]
        out = run_all(engine, {})["r"]  # runs "r" to its end
        assert type(out.prompt_token_ids) is list and out.prompt_token_ids == prompts_of([40])[0]
        assert type(out.outputs[0].token_ids) is list and len(out.outputs[0].token_ids) == 6
    finally:
        engine.shutdown()
