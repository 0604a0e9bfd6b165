"""`AsyncLLM`: the synchronous `LLMEngine` behind an asyncio interface, for the API server.

The engine is not thread-safe, so every engine call happens on one background thread, the engine
loop: it takes commands (add, abort, stop) from a queue, steps the engine while it has work, and
hands each `RequestOutput` to the asyncio queue of its request through
`loop.call_soon_threadsafe`. Coroutines never touch the engine; they await futures that the loop
resolves. One bad request fails alone (its `add_request` raises); an exception inside `step()` is
fatal: every open request gets an `EngineDeadError` and `/health` reports 503.
"""

import asyncio
import concurrent.futures
import dataclasses
import queue
import threading
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

from vllm.logger import init_logger
from vllm.outputs import RequestOutput
from vllm.sampling_params import SamplingParams

logger = init_logger(__name__)

# How long the idle loop sleeps on the command queue before checking for a stop.
_IDLE_WAIT_S = 0.5


class EngineDeadError(RuntimeError):
    """The engine loop stopped after an unrecoverable error; no request can run."""


@dataclasses.dataclass
class SchedulerStats:
    """The engine's load and cache occupancy after the latest loop iteration."""

    num_running: int = 0
    num_waiting: int = 0
    kv_cache_usage: float = 0.0
    num_free_blocks: int = 0
    initial_num_free_blocks: int = 0
    num_free_kda_slots: int = 0
    initial_num_free_kda_slots: int = 0


@dataclasses.dataclass
class IterationStats:
    """What one engine step produced, for the metrics (times in seconds)."""

    num_prompt_tokens: int = 0
    num_generation_tokens: int = 0
    time_to_first_token: list[float] = dataclasses.field(default_factory=list)
    time_per_output_token: list[float] = dataclasses.field(default_factory=list)
    # (finish reason, e2e latency) of each completion that ended (each of n counts).
    finished: list[tuple[str, float]] = dataclasses.field(default_factory=list)


class StatLogger:
    """Receives the engine loop's statistics (called on the engine thread)."""

    def record(self, scheduler: SchedulerStats, iteration: IterationStats | None) -> None:
        raise NotImplementedError


@dataclasses.dataclass
class _Tracked:
    """Per-request bookkeeping of the engine loop (timing and token counts)."""

    loop: asyncio.AbstractEventLoop
    queue: asyncio.Queue
    arrival: float
    # Completion indices whose prompt is counted: once its first token came (or it ended
    # without one). Each of n prefills the prompt as a sequence of its own, as upstream's child
    # requests do, so each counts it, and its time to first token.
    prompted: set[int] = dataclasses.field(default_factory=set)
    # Completion index -> (its tokens so far, when the last of them came): with n > 1 each
    # completion is a sequence of its own, whose tokens come one step apart.
    completions: dict[int, tuple[int, float]] = dataclasses.field(default_factory=dict)
    # Completion indices already counted as finished (each of n is a finished request).
    ended: set[int] = dataclasses.field(default_factory=set)


class AsyncLLM:
    """Runs `engine` on a dedicated thread; `generate()` streams a request's outputs."""

    def __init__(self, engine: Any, stat_loggers: list[StatLogger] | None = None) -> None:
        self.engine = engine
        self.tokenizer = engine.tokenizer
        self.config = engine.config
        self.stat_loggers = list(stat_loggers or [])
        self.scheduler_stats = SchedulerStats()
        self.errored: BaseException | None = None
        self._commands: queue.SimpleQueue = queue.SimpleQueue()
        self._tracked: dict[str, _Tracked] = {}
        self._stopping = False
        # Guards `_closed` against a command queued after the loop drained the queue for good.
        self._submit_lock = threading.Lock()
        self._closed = False
        self._refresh_scheduler_stats()
        self._thread = threading.Thread(target=self._run, name="engine-loop", daemon=True)
        self._thread.start()

    @property
    def is_running(self) -> bool:
        """Whether requests can be served: the loop runs, and so do any tensor-parallel
        workers (one that died while the engine was idle is otherwise found only by the next
        request, which it fails, while /health said 200)."""
        return (
            self.errored is None
            and not self._stopping
            and self._thread.is_alive()
            and self.engine.workers_alive()
        )

    def _submit(self, command: tuple) -> None:
        """Queue a command whose future the loop answers; refused once the loop has closed."""
        with self._submit_lock:
            if self._closed or not self.is_running:
                raise EngineDeadError("the engine is not running") from self.errored
            self._commands.put(command)

    def add_stat_logger(self, stat_logger: StatLogger) -> None:
        self.stat_loggers.append(stat_logger)
        stat_logger.record(self.scheduler_stats, None)

    async def add_request(
        self,
        request_id: str,
        prompt: "str | list[int]",
        params: SamplingParams,
        arrival: float | None = None,
    ) -> AsyncIterator[RequestOutput]:
        """Add a request; once the engine accepted it, return the iterator of its outputs.

        `arrival`: the `time.monotonic()` its latencies count from (default: now); a server
        handler passes the time it got the request, before it tokenized the prompt.

        Raises ValueError if the engine refuses the request. The iterator yields the latest output
        whenever it changed, until it finishes; closing it early aborts the request. A caller that
        may drop the iterator unstarted must `abort()` the id itself (aborting is idempotent);
        cancelled while waiting for the engine, it leaves nothing behind."""
        # As upstream's from the frontend's arrival: the caller's input processing (a server's
        # tokenization) and the wait for the step the loop is running are part of the latencies.
        arrival = time.monotonic() if arrival is None else arrival
        loop = asyncio.get_running_loop()
        outputs: asyncio.Queue = asyncio.Queue()
        added: concurrent.futures.Future = concurrent.futures.Future()
        self._submit(("add", request_id, prompt, params, loop, outputs, arrival, added))
        try:
            await asyncio.wrap_future(added)
        except asyncio.CancelledError:
            # The caller gave up (its client hung up). Cancelling `added` withdrew the command
            # unless the loop had already taken it; then the request is added for nobody, so
            # abort it once it is (only if it was: the id may belong to another request).
            added.add_done_callback(
                lambda f: f.cancelled() or f.exception() is not None or self.abort(request_id)
            )
            raise
        return self._stream(request_id, outputs)

    async def generate(
        self, request_id: str, prompt: "str | list[int]", params: SamplingParams
    ) -> AsyncIterator[RequestOutput]:
        """`add_request` and iterate its outputs."""
        stream = await self.add_request(request_id, prompt, params)
        try:
            async for out in stream:
                yield out
        finally:
            await stream.aclose()  # aborts the request unless it finished

    async def _stream(
        self, request_id: str, outputs: asyncio.Queue
    ) -> AsyncIterator[RequestOutput]:
        finished = False
        try:
            while True:
                item = await outputs.get()
                # Outputs are cumulative, so a consumer that fell behind only needs the latest.
                while not outputs.empty() and not isinstance(item, BaseException):
                    item = outputs.get_nowait()
                if isinstance(item, BaseException):
                    raise item
                finished = item.finished
                yield item
                if finished:
                    return
        finally:
            if not finished:
                self.abort(request_id)

    def abort(self, request_id: str) -> None:
        """Abort a request (no-op if it already finished); returns at once."""
        self._commands.put(("abort", request_id))

    async def call(self, fn: Callable[[Any], Any]) -> Any:
        """Run `fn(engine)` on the engine thread and return its result."""
        done: concurrent.futures.Future = concurrent.futures.Future()
        self._submit(("call", fn, done))
        return await asyncio.wrap_future(done)

    def stop(self) -> None:
        """Begin stopping without waiting: the loop ends after its current step, and every open
        request then ends with `EngineDeadError("the server is shutting down")`, so a server that
        is shutting down answers its in-flight requests at once instead of leaving them to be
        cancelled mid-response. Idempotent."""
        self._stopping = True
        self._commands.put(("stop",))

    def shutdown(self, timeout: float = 30.0) -> None:
        """Stop the loop (aborting what is in flight) and the engine's workers."""
        self.stop()
        if self._thread.is_alive() and threading.current_thread() is not self._thread:
            self._thread.join(timeout)
        self.engine.shutdown()

    # -- the engine thread -----------------------------------------------------------------------

    def _run(self) -> None:
        try:
            while not self._stopping:
                busy = self.engine.has_unfinished_requests()
                self._handle_commands(block=not busy)
                if self._stopping:
                    break
                iteration, deliveries = None, []
                if self.engine.has_unfinished_requests():
                    iteration, deliveries = self._step()
                try:
                    self._refresh_scheduler_stats()
                    for stat_logger in self.stat_loggers:
                        stat_logger.record(self.scheduler_stats, iteration)
                finally:
                    # After the stats: a caller that sees its output finds it counted in
                    # /metrics. Even if they fail: a finished request is no longer tracked, so
                    # the loop's end would not tell its caller anything.
                    for tracked, out in deliveries:
                        self._deliver(tracked, out)
        except BaseException as e:
            logger.exception("The engine loop failed; the server can no longer run requests")
            self.errored = e
        finally:
            reason = "the engine stopped" if self.errored else "the server is shutting down"
            self._fail_all(EngineDeadError(reason))

    def _handle_commands(self, block: bool) -> None:
        while True:
            try:
                command = self._commands.get(timeout=_IDLE_WAIT_S) if block else None
                if command is None:
                    command = self._commands.get_nowait()
            except queue.Empty:
                return
            block = False
            kind = command[0]
            if kind == "stop":
                self._stopping = True
                return
            if kind == "abort":
                self._abort(command[1])
            elif not command[-1].set_running_or_notify_cancel():
                # Its caller was cancelled while the command waited: skip it, as a result could
                # not be set on the cancelled future. From here on it can no longer be cancelled.
                continue
            elif kind == "add":
                self._add(*command[1:])
            elif kind == "call":
                fn, done = command[1:]
                try:
                    done.set_result(fn(self.engine))
                except Exception as e:
                    done.set_exception(e)

    def _add(self, request_id, prompt, params, loop, outputs, arrival, added) -> None:
        if request_id in self._tracked:
            added.set_exception(ValueError(f"request id {request_id!r} is already in use"))
            return
        try:
            self.engine.add_request(request_id, prompt, params)
        except Exception as e:  # the request's own fault (ValueError) or a refused value
            added.set_exception(e)
            return
        self._tracked[request_id] = _Tracked(loop, outputs, arrival)
        added.set_result(None)

    def _abort(self, request_id: str) -> None:
        if self._tracked.pop(request_id, None) is not None:
            self.engine.abort_request([request_id])

    def _step(self) -> tuple[IterationStats, list[tuple[_Tracked, RequestOutput]]]:
        """One engine step: its stats and the outputs to deliver (after the stats are recorded)."""
        outputs = self.engine.step()
        now = time.monotonic()
        stats = IterationStats()
        deliveries = []
        for out in outputs:
            tracked = self._tracked.get(out.request_id)
            if tracked is None:
                continue
            before_step = sum(count for count, _ in tracked.completions.values())
            new = sum(len(c.token_ids) for c in out.outputs) - before_step
            for c in out.outputs:
                if c.index not in tracked.prompted and (c.token_ids or c.finish_reason):
                    tracked.prompted.add(c.index)
                    stats.num_prompt_tokens += len(out.prompt_token_ids)
                    if c.token_ids:  # not one that ended without a token (a failed step's)
                        stats.time_to_first_token.append(now - tracked.arrival)
                # Time per output token: per completion, the time since its previous tokens
                # over the tokens that came now (not over all completions' tokens, which would
                # divide a step's time by n).
                before, last = tracked.completions.get(c.index, (0, now))
                if len(c.token_ids) > before:
                    if before:
                        gap = (now - last) / (len(c.token_ids) - before)
                        stats.time_per_output_token.append(gap)
                    tracked.completions[c.index] = (len(c.token_ids), now)
                # Each completion counts as a finished request at its own end, under its own
                # reason, as upstream's child requests of n do (not the whole request once,
                # under completion 0's reason).
                if c.finish_reason is not None and c.index not in tracked.ended:
                    tracked.ended.add(c.index)
                    stats.finished.append((c.finish_reason, now - tracked.arrival))
            stats.num_generation_tokens += max(new, 0)
            if out.finished:  # every completion has its finish reason: counted above
                del self._tracked[out.request_id]
            deliveries.append((tracked, out))
        return stats, deliveries

    def _deliver(self, tracked: _Tracked, item: Any) -> None:
        try:
            tracked.loop.call_soon_threadsafe(tracked.queue.put_nowait, item)
        except RuntimeError:  # the caller's event loop is closed: nobody is waiting
            pass

    def _fail_all(self, error: BaseException) -> None:
        with self._submit_lock:
            self._closed = True
        # Abort every open request in the engine before failing any stream, so that the first
        # stream to fail finds the cache blocks and state slots of all of them released (and
        # /metrics says so).
        open_requests = list(self._tracked.items())
        self._tracked.clear()
        try:
            for request_id, _ in open_requests:
                try:
                    self.engine.abort_request([request_id])
                except Exception:
                    logger.exception("aborting %s after the loop stopped failed", request_id)
            try:
                self._refresh_scheduler_stats()
            except Exception:
                logger.exception("refreshing the scheduler stats after the loop stopped failed")
            # The stat loggers too: /metrics would otherwise show the last iteration's load
            # (requests running, blocks in use) for as long as the server stays up.
            for stat_logger in self.stat_loggers:
                try:
                    stat_logger.record(self.scheduler_stats, None)
                except Exception:
                    logger.exception("recording the stats after the loop stopped failed")
        finally:
            for _, tracked in open_requests:
                self._deliver(tracked, error)
        while True:
            try:
                command = self._commands.get_nowait()
            except queue.Empty:
                return
            # As in `_handle_commands`: a check of done() then set_exception() would raise if
            # the caller were cancelled in between, and leave the commands after it unanswered.
            if command[0] in ("add", "call") and command[-1].set_running_or_notify_cancel():
                command[-1].set_exception(error)

    def _refresh_scheduler_stats(self) -> None:
        kv = self.engine.kv_cache_manager
        scheduler = self.engine.scheduler
        self.scheduler_stats = SchedulerStats(
            num_running=scheduler.num_running,
            num_waiting=scheduler.num_waiting,
            kv_cache_usage=float(kv.usage),
            num_free_blocks=kv.num_free_blocks,
            initial_num_free_blocks=kv.initial_num_free_blocks,
            num_free_kda_slots=kv.num_free_kda_slots,
            initial_num_free_kda_slots=kv.initial_num_free_kda_slots,
        )
