"""AsyncLLM over a scripted engine: concurrent requests, early close aborts and frees, a refused
request leaves the loop running, a failing step fails every open request and /health's state (and
the stat loggers see those requests released), a caller cancelled while its request is being added
(its client hung up) leaves the loop serving and nothing in the engine, and one cancelled while the
dying loop answers it leaves the rest answered."""

import asyncio
import concurrent.futures
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from fake_engine import FakeEngine  # noqa: E402

from vllm.outputs import CompletionOutput, RequestOutput  # noqa: E402
from vllm.sampling_params import SamplingParams  # noqa: E402
from vllm.v1.engine.async_llm import AsyncLLM, EngineDeadError, StatLogger  # noqa: E402


@pytest.fixture
def llm():
    engine = AsyncLLM(FakeEngine("The quick brown fox jumps over the lazy dog."))
    yield engine
    engine.shutdown()


async def _collect(llm: AsyncLLM, request_id: str, prompt: str, max_tokens: int) -> str:
    last = None
    async for out in llm.generate(request_id, prompt, SamplingParams(max_tokens=max_tokens)):
        last = out
    assert last.finished
    return last.outputs[0].text


def test_concurrent_requests_each_get_their_own_output(llm: AsyncLLM) -> None:
    async def main() -> list[str]:
        return await asyncio.gather(*(_collect(llm, f"r{i}", "hi", 3 + i) for i in range(8)))

    texts = asyncio.run(main())
    script = "The quick brown fox jumps over the lazy dog."
    assert texts == [script[: 3 + i] for i in range(8)]
    assert llm.engine.requests == {}


async def _eventually(condition: Callable[[], bool], timeout: float = 30.0) -> None:
    """Wait for what the engine loop does on its own thread after a call returned."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"not reached within {timeout} s"
        await asyncio.sleep(0.01)


def test_closing_the_stream_early_aborts_and_frees() -> None:
    # A slow read of the cache counters widens the window between the engine's release of the
    # request and the loop's refresh of `scheduler_stats`.
    engine = FakeEngine("The quick brown fox jumps over the lazy dog.", stats_delay=0.2)
    llm = AsyncLLM(engine)
    try:

        async def main() -> None:
            stream = await llm.add_request("a", "hi", SamplingParams(max_tokens=100))
            async for out in stream:
                assert not out.finished
                break
            await stream.aclose()  # queues the abort and returns
            await _eventually(lambda: llm.scheduler_stats.num_running == 0)

        asyncio.run(main())
        kv = engine.kv_cache_manager
        assert engine.requests == {}
        assert kv.num_free_blocks == kv.initial_num_free_blocks
        assert llm.scheduler_stats.num_free_kda_slots == kv.initial_num_free_kda_slots
    finally:
        llm.shutdown()


def test_refused_request_raises_and_the_loop_keeps_serving(llm: AsyncLLM) -> None:
    async def main() -> str:
        with pytest.raises(ValueError, match="empty"):
            await llm.add_request("bad", [], SamplingParams())
        return await _collect(llm, "good", "hi", 4)

    assert asyncio.run(main()) == "The "
    assert llm.is_running


def test_duplicate_request_id_is_refused(llm: AsyncLLM) -> None:
    async def main() -> None:
        stream = await llm.add_request("dup", "hi", SamplingParams(max_tokens=50))
        with pytest.raises(ValueError, match="already in use"):
            await llm.add_request("dup", "hi", SamplingParams())
        await stream.aclose()

    asyncio.run(main())


def test_step_failure_kills_the_loop_and_fails_open_requests() -> None:
    engine = FakeEngine("abc")

    def broken_step():
        raise RuntimeError("device lost")

    llm = AsyncLLM(engine)
    try:
        engine.step = broken_step

        async def main() -> None:
            with pytest.raises(EngineDeadError):
                await _collect(llm, "x", "hi", 5)

        asyncio.run(main())
        assert not llm.is_running
        assert isinstance(llm.errored, RuntimeError)
    finally:
        llm.shutdown()
    assert engine.shut_down


def test_stat_loggers_see_the_requests_released_when_the_loop_dies() -> None:
    """The engine loop's failure aborts every open request; the stat loggers (/metrics) must be
    told, by the time a caller hears of it, or they keep the last iteration's load for good."""
    engine = FakeEngine("abc")
    seen: list = []

    class Recorder(StatLogger):
        def record(self, scheduler, iteration) -> None:
            seen.append(scheduler)

    llm = AsyncLLM(engine, [Recorder()])
    try:

        async def main() -> None:
            streams = []
            for request_id in ("a", "b"):
                streams.append(
                    await llm.add_request(request_id, "hi", SamplingParams(max_tokens=10**6))
                )
            async for _ in streams[1]:  # delivered after a step of both was recorded
                break
            assert seen[-1].num_running == 2

            def broken_step():
                raise RuntimeError("device lost")

            engine.step = broken_step
            with pytest.raises(EngineDeadError):
                async for _ in streams[0]:
                    pass
            kv = engine.kv_cache_manager
            assert (seen[-1].num_running, seen[-1].kv_cache_usage) == (0, 0.0)
            assert seen[-1].num_free_blocks == kv.initial_num_free_blocks
            assert seen[-1].num_free_kda_slots == kv.initial_num_free_kda_slots
            await streams[1].aclose()

        asyncio.run(asyncio.wait_for(main(), timeout=10))
    finally:
        llm.shutdown()


def test_a_request_ended_before_its_first_token_has_no_time_to_first_token(llm: AsyncLLM) -> None:
    """A failed step finishes its requests with finish_reason "error" and no token: counted as
    finished, never as a time to first token."""
    seen = {"finished": [], "ttft": 0}

    class Recorder(StatLogger):
        def record(self, scheduler, iteration) -> None:
            if iteration is not None:
                seen["finished"] += [reason for reason, _ in iteration.finished]
                seen["ttft"] += len(iteration.time_to_first_token)

    engine = llm.engine

    def failed_step():
        for request in list(engine.requests.values()):
            request.finish_reason = "error"
        return [engine._finish(request) for request in list(engine.requests.values())]

    engine.step = failed_step
    llm.add_stat_logger(Recorder())

    async def main() -> list:
        return [out async for out in llm.generate("e", "hi", SamplingParams(max_tokens=4))]

    (out,) = asyncio.run(asyncio.wait_for(main(), timeout=10))
    assert out.finished and out.outputs[0].token_ids == []
    assert seen == {"finished": ["error"], "ttft": 0}


def test_stat_loggers_see_tokens_and_finished_requests(llm: AsyncLLM) -> None:
    seen = {"generated": 0, "finished": [], "ttft": 0}

    class Recorder(StatLogger):
        def record(self, scheduler, iteration) -> None:
            if iteration is not None:
                seen["generated"] += iteration.num_generation_tokens
                seen["finished"] += [reason for reason, _ in iteration.finished]
                seen["ttft"] += len(iteration.time_to_first_token)

    llm.add_stat_logger(Recorder())
    asyncio.run(_collect(llm, "s", "hi", 6))
    assert seen == {"generated": 6, "finished": ["length"], "ttft": 1}


def test_time_per_output_token_is_per_completion_with_n() -> None:
    """With n > 1 every completion gets a token each step: the time per output token is a
    step's time, not a step's time over n (the tokens of all completions together)."""
    step_delay = 0.02
    gaps: list[float] = []

    class Recorder(StatLogger):
        def record(self, scheduler, iteration) -> None:
            if iteration is not None:
                gaps.extend(iteration.time_per_output_token)

    llm = AsyncLLM(FakeEngine("abcdefgh", step_delay=step_delay), [Recorder()])
    try:

        async def main() -> None:
            async for _ in llm.generate("n3", "hi", SamplingParams(max_tokens=5, n=3)):
                pass

        asyncio.run(asyncio.wait_for(main(), timeout=10))
    finally:
        llm.shutdown()
    assert len(gaps) == 3 * (5 - 1)  # each completion's tokens after its first
    assert min(gaps) >= step_delay  # each gap spans at least one whole step


def _scripted(steps: list[list[tuple[int, str | None]]], step_delay: float = 0.0) -> FakeEngine:
    """A fake engine whose steps give the one request's completions as scripted: per step, per
    completion, (its token count, its finish reason); the request ends when all have one."""
    engine = FakeEngine("abcdefgh")
    script = iter(steps)

    def scripted_step() -> list[RequestOutput]:
        time.sleep(step_delay)
        (request,) = engine.requests.values()
        completions = next(script)
        outputs = [
            CompletionOutput(i, "", [7] * count, None, None, finish_reason=reason)
            for i, (count, reason) in enumerate(completions)
        ]
        done = all(reason is not None for _, reason in completions)
        if done:
            del engine.requests[request.request_id]
        return [RequestOutput(request.request_id, None, request.prompt_ids, None, outputs, done)]

    engine.step = scripted_step
    return engine


def test_each_completion_of_n_is_a_finished_request_with_its_own_reason() -> None:
    """Upstream runs each of n's completions as a request of its own: each one counts in
    request_success under its own finish reason, and in the e2e latency at its own end (not one
    request under completion 0's reason)."""
    step_delay = 0.02
    finished: list[tuple[str, float]] = []

    class Recorder(StatLogger):
        def record(self, scheduler, iteration) -> None:
            if iteration is not None:
                finished.extend(iteration.finished)

    # Completion 1 ends on a stop token at its first token; completion 0 goes on.
    engine = _scripted([[(1, None), (1, "stop")], [(2, "length"), (1, "stop")]], step_delay)
    llm = AsyncLLM(engine, [Recorder()])
    try:

        async def main() -> None:
            async for _ in llm.generate("n2", "hi", SamplingParams(max_tokens=2, n=2)):
                pass

        asyncio.run(asyncio.wait_for(main(), timeout=10))
    finally:
        llm.shutdown()
    assert sorted(reason for reason, _ in finished) == ["length", "stop"]
    latency = dict(finished)
    assert latency["length"] - latency["stop"] >= step_delay  # each at its own end


def test_each_completion_of_n_counts_the_prompt_and_a_time_to_first_token() -> None:
    """Each of n prefills the prompt as a sequence of its own (upstream's child requests): each
    counts its prompt tokens and its time to first token, when its own first token comes."""
    seen = {"prompt": [], "ttft": []}

    class Recorder(StatLogger):
        def record(self, scheduler, iteration) -> None:
            if iteration is not None:
                seen["prompt"].append(iteration.num_prompt_tokens)
                seen["ttft"].append(len(iteration.time_to_first_token))

    # Completion 1's first token comes a step after completion 0's.
    engine = _scripted([[(1, None), (0, None)], [(2, "length"), (1, "length")]])
    llm = AsyncLLM(engine, [Recorder()])
    try:

        async def main() -> list:
            params = SamplingParams(max_tokens=2, n=2)
            return [out async for out in llm.generate("n2", "hi", params)]

        outs = asyncio.run(asyncio.wait_for(main(), timeout=10))
    finally:
        llm.shutdown()
    prompt = len(outs[-1].prompt_token_ids)
    assert prompt > 0
    assert [n for n in seen["prompt"] if n] == [prompt, prompt]
    assert [n for n in seen["ttft"] if n] == [1, 1]


def test_each_completion_of_n_that_ends_without_a_token_counts_the_prompt() -> None:
    """A completion that ends before any token (max_tokens=0 scores the prompt: its prefill ran)
    counts its prompt's tokens, each of n, but no time to first token."""
    seen = {"prompt": 0, "ttft": 0, "finished": []}

    class Recorder(StatLogger):
        def record(self, scheduler, iteration) -> None:
            if iteration is not None:
                seen["prompt"] += iteration.num_prompt_tokens
                seen["ttft"] += len(iteration.time_to_first_token)
                seen["finished"] += [reason for reason, _ in iteration.finished]

    engine = _scripted([[(0, "length"), (0, "length")]])
    llm = AsyncLLM(engine, [Recorder()])
    try:

        async def main() -> list:
            params = SamplingParams(max_tokens=0, n=2)
            return [out async for out in llm.generate("n0", "hi", params)]

        (out,) = asyncio.run(asyncio.wait_for(main(), timeout=10))
    finally:
        llm.shutdown()
    prompt = len(out.prompt_token_ids)
    assert prompt > 0
    assert seen == {"prompt": 2 * prompt, "ttft": 0, "finished": ["length", "length"]}


def test_latencies_count_from_the_request_s_arrival_not_from_its_admission() -> None:
    """Time to first token and e2e latency count from when the request arrived (upstream: from
    the frontend's arrival, to include input processing), not from when the engine accepted it:
    that left out its tokenization and its wait for the step the loop was running."""
    input_processing = 0.2
    seen: dict[str, list[float]] = {"ttft": [], "e2e": []}

    class Recorder(StatLogger):
        def record(self, scheduler, iteration) -> None:
            if iteration is not None:
                seen["ttft"] += iteration.time_to_first_token
                seen["e2e"] += [latency for _, latency in iteration.finished]

    engine = FakeEngine("abcdefgh")
    add = engine.add_request

    def slow_add(*args) -> None:
        time.sleep(input_processing)  # tokenizing a long prompt
        add(*args)

    engine.add_request = slow_add
    llm = AsyncLLM(engine, [Recorder()])
    try:

        async def main() -> None:
            async for _ in llm.generate("slow", "hi", SamplingParams(max_tokens=2)):
                pass

        asyncio.run(asyncio.wait_for(main(), timeout=10))
    finally:
        llm.shutdown()
    assert len(seen["ttft"]) == len(seen["e2e"]) == 1
    assert seen["ttft"][0] >= input_processing
    assert seen["e2e"][0] >= input_processing


def test_a_failing_stat_logger_still_delivers_the_final_output(llm: AsyncLLM) -> None:
    """A request that finishes in the step whose stats fail is no longer tracked when the loop
    ends: its last output must go out anyway, or its caller would wait forever."""

    class FailsAtTheEnd(StatLogger):
        def record(self, scheduler, iteration) -> None:
            if iteration is not None and iteration.finished:
                raise RuntimeError("stats backend down")

    llm.add_stat_logger(FailsAtTheEnd())
    text = asyncio.run(asyncio.wait_for(_collect(llm, "s", "hi", 3), timeout=10))
    assert text == "The quick brown fox jumps over the lazy dog."[: len(text)] and text
    deadline = time.monotonic() + 10  # the loop ends just after delivering
    while llm.errored is None and time.monotonic() < deadline:
        time.sleep(0.01)
    assert isinstance(llm.errored, RuntimeError) and not llm.is_running


def test_stop_ends_open_requests_at_once_and_refuses_new_ones() -> None:
    # A slow abort widens the window in which a caller could see the error before the engine
    # released the requests: the loop must abort them all first, then tell the callers.
    engine = FakeEngine("abc", step_delay=0.01, abort_delay=0.2)
    llm = AsyncLLM(engine)
    try:

        async def main() -> None:
            streams = []
            for request_id in ("open", "also-open"):
                params = SamplingParams(max_tokens=10_000)
                streams.append(await llm.add_request(request_id, "hi", params))
            for stream in streams:
                async for out in stream:
                    assert not out.finished
                    break
            llm.stop()  # returns at once; the loop ends after its current step
            with pytest.raises(EngineDeadError, match="the server is shutting down"):
                async for _ in streams[0]:
                    pass
            # The first caller to hear of the stop finds every open request released.
            assert engine.requests == {}
            with pytest.raises(EngineDeadError, match="the server is shutting down"):
                async for _ in streams[1]:
                    pass
            with pytest.raises(EngineDeadError):
                await llm.add_request("late", "hi", SamplingParams())

        asyncio.run(asyncio.wait_for(main(), timeout=10))
        assert not llm.is_running and llm.errored is None
    finally:
        llm.shutdown()
    assert engine.shut_down


def test_commands_right_after_stop_are_refused_not_left_waiting(llm: AsyncLLM) -> None:
    """Between stop() and the loop's last drain a request or call must fail at once: queued
    after the drain, nothing would ever answer it."""

    async def main() -> None:
        llm.stop()
        assert not llm.is_running  # at once, while the loop thread may still be finishing
        with pytest.raises(EngineDeadError):
            await llm.add_request("late", "hi", SamplingParams())
        with pytest.raises(EngineDeadError):
            await llm.call(lambda engine: None)

    asyncio.run(asyncio.wait_for(main(), timeout=5))


def test_a_caller_cancelled_before_the_loop_takes_its_add_leaves_the_loop_serving(
    llm: AsyncLLM,
) -> None:
    """A client that hangs up while its request waits in the command queue (the loop is busy in
    a step) cancels the caller; the loop must skip the command, not die setting its result."""
    gate = threading.Event()

    async def main() -> None:
        busy = asyncio.ensure_future(llm.call(lambda engine: gate.wait(10)))
        add = asyncio.ensure_future(llm.add_request("gone", "hi", SamplingParams(max_tokens=10**6)))
        await asyncio.sleep(0)  # both commands are queued behind the blocking call
        add.cancel()
        await asyncio.gather(add, return_exceptions=True)
        gate.set()
        assert await busy
        assert await llm.call(lambda engine: dict(engine.requests)) == {}
        assert await _collect(llm, "next", "hi", 4) == "The "

    try:
        asyncio.run(asyncio.wait_for(main(), timeout=10))
    finally:
        gate.set()
    assert llm.is_running


def test_a_caller_cancelled_while_the_engine_adds_its_request_aborts_it(llm: AsyncLLM) -> None:
    """Once the loop has taken the add, cancelling the caller cannot withdraw it: the request
    is added for nobody and must be aborted, or it would run to max_tokens holding its cache."""
    entered, gate = threading.Event(), threading.Event()
    add_request = llm.engine.add_request

    def slow_add(*args) -> None:
        entered.set()
        gate.wait(10)
        add_request(*args)

    llm.engine.add_request = slow_add

    async def main() -> None:
        add = asyncio.ensure_future(llm.add_request("gone", "hi", SamplingParams(max_tokens=10**6)))
        assert await asyncio.to_thread(entered.wait, 10)
        add.cancel()
        await asyncio.gather(add, return_exceptions=True)
        gate.set()
        # Adding queues the abort before the loop takes the first call, so the second sees it.
        await llm.call(lambda engine: None)
        assert await llm.call(lambda engine: dict(engine.requests)) == {}

    try:
        asyncio.run(asyncio.wait_for(main(), timeout=10))
    finally:
        gate.set()
    assert llm.is_running


class _CancelledRightAfterTheCheck(concurrent.futures.Future):
    """A future whose caller is cancelled just after anyone checks that it is still pending: the
    race of a client hanging up while the dying loop answers the queued commands."""

    def done(self) -> bool:
        pending = not super().done()
        if pending:
            self.cancel()
        return not pending


def test_a_caller_cancelled_while_the_dying_loop_answers_it_leaves_the_rest_answered(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Commands still queued when the loop fails are each answered with EngineDeadError; one whose
    caller is cancelled meanwhile must not stop the others' answers (they would wait forever)."""
    engine = FakeEngine("abc")
    entered, gate = threading.Event(), threading.Event()

    def failing_step():
        entered.set()
        gate.wait(10)
        raise RuntimeError("device lost")

    engine.step = failing_step
    llm = AsyncLLM(engine)

    async def main() -> None:
        doomed = asyncio.ensure_future(_collect(llm, "x", "hi", 5))
        assert await asyncio.to_thread(entered.wait, 10)
        with monkeypatch.context() as patch:
            patch.setattr(concurrent.futures, "Future", _CancelledRightAfterTheCheck)
            racing = asyncio.ensure_future(llm.call(lambda engine: None))
            await asyncio.sleep(0)  # queued with its future made while the patch holds
        gone = asyncio.ensure_future(llm.call(lambda engine: None))
        later = asyncio.ensure_future(llm.call(lambda engine: None))
        await asyncio.sleep(0)
        gone.cancel()  # its caller gave up before the loop died: skipped by the drain
        await asyncio.gather(gone, return_exceptions=True)
        gate.set()
        for task in (doomed, later):
            with pytest.raises(EngineDeadError):
                await task
        await asyncio.gather(racing, return_exceptions=True)
        assert gone.cancelled()

    try:
        asyncio.run(asyncio.wait_for(main(), timeout=10))
    finally:
        gate.set()
        llm.shutdown()
    assert isinstance(llm.errored, RuntimeError)
