"""`Scheduler`: continuous batching under a token budget, with chunked prefill and preemption.

Each step first gives every running request that has one token left to compute a decode, then
spends the rest of the budget on prefill chunks: running requests part-way through a prefill, then
waiting requests in order. When a request cannot get a block, the most recently admitted running
request is preempted by recompute (it frees everything and later re-prefills all its tokens). So the
oldest running request always makes progress, and `add_request` refuses any request that could not
finish alone in the cache, hence every request eventually finishes.
"""

from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field

from vllm.logger import init_logger
from vllm.v1.core.kv_cache_manager import KVCacheManager
from vllm.v1.core.sched.output import ScheduledRequest, SchedulerOutput
from vllm.v1.request import Request, RequestStatus

logger = init_logger(__name__)


@dataclass
class _Step:
    budget: int
    scheduled: dict[str, ScheduledRequest] = field(default_factory=dict)
    preempted: list[str] = field(default_factory=list)


def _is_decode(request: Request) -> bool:
    return request.num_computed_tokens > 0 and request.num_tokens - request.num_computed_tokens == 1


class Scheduler:
    """Owns the waiting and running queues; `schedule()` and `update_from_output()` alternate."""

    def __init__(
        self,
        max_num_seqs: int,
        max_num_batched_tokens: int,
        max_model_len: int,
        kv_cache_manager: KVCacheManager,
    ) -> None:
        for name, value, low in (
            ("max_num_seqs", max_num_seqs, 1),
            ("max_num_batched_tokens", max_num_batched_tokens, 1),
            ("max_model_len", max_model_len, 2),
        ):
            if not isinstance(value, int) or isinstance(value, bool) or value < low:
                raise ValueError(f"{name} must be an integer >= {low}, got {value!r}")
        if max_num_batched_tokens < max_num_seqs:
            # Every running request's decode must fit one step's budget.
            raise ValueError(
                f"max_num_batched_tokens ({max_num_batched_tokens}) must be >= max_num_seqs "
                f"({max_num_seqs})"
            )
        if not isinstance(kv_cache_manager, KVCacheManager):
            raise ValueError(f"kv_cache_manager must be a KVCacheManager, got {kv_cache_manager!r}")
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.max_model_len = max_model_len
        self.kv_cache_manager = kv_cache_manager
        self.requests: dict[str, Request] = {}
        self.waiting: deque[Request] = deque()
        # Admission order: the tail is the first to be preempted.
        self.running: list[Request] = []
        # Steps scheduled and not yet recorded, oldest first: one, or two when `AsyncScheduler`
        # scheduled a step ahead of the one in flight.
        self._pending: list[SchedulerOutput] = []

    @property
    def num_running(self) -> int:
        return len(self.running)

    @property
    def num_waiting(self) -> int:
        """Waiting requests, preempted ones included."""
        return len(self.waiting)

    def has_unfinished_requests(self) -> bool:
        return bool(self.requests)

    def get_num_unfinished_requests(self) -> int:
        return len(self.requests)

    def add_request(self, request: Request) -> None:
        if not isinstance(request, Request) or request.status != RequestStatus.WAITING:
            raise ValueError(f"request must be a new Request, got {request!r}")
        if request.request_id in self.requests:
            raise ValueError(f"request id {request.request_id!r} is already scheduled")
        if request.num_tokens >= self.max_model_len:
            raise ValueError(
                f"request {request.request_id!r} has {request.num_tokens} prompt tokens, "
                f"max_model_len is {self.max_model_len}"
            )
        # The last step that computes anything holds every token but the final sampled one.
        most_cached = min(request.num_tokens + request.max_tokens, self.max_model_len) - 1
        kv = self.kv_cache_manager
        if kv.num_blocks_for(most_cached) > kv.initial_num_free_blocks:
            raise ValueError(
                f"request {request.request_id!r} may need {most_cached} cached tokens, more than "
                f"the cache holds ({kv.initial_num_free_blocks} blocks of {kv.block_size})"
            )
        self.requests[request.request_id] = request
        self.waiting.append(request)

    def finish_requests(
        self, request_ids: str | Iterable[str], status: RequestStatus
    ) -> list[Request]:
        """Finish requests in any state, freeing their cache; ids already finished are skipped
        (an abort may race a natural finish). Returns the requests finished here."""
        if not isinstance(status, RequestStatus) or not status.is_finished:
            raise ValueError(f"status must be a finished RequestStatus, got {status!r}")
        if isinstance(request_ids, str):
            request_ids = [request_ids]
        finished = []
        for request_id in request_ids:
            request = self.requests.pop(request_id, None)
            if request is None:
                continue
            if request.status == RequestStatus.RUNNING:
                self.running.remove(request)
            else:
                self.waiting.remove(request)
            self.kv_cache_manager.free(request)
            request.status = status
            finished.append(request)
        return finished

    def schedule(self) -> SchedulerOutput:
        if self._pending:
            raise RuntimeError("schedule() called again before update_from_output()")
        step = _Step(budget=self.max_num_batched_tokens)
        running, scheduled = self.running, step.scheduled
        kv = self.kv_cache_manager
        tables, slots, block_size = kv.block_tables, kv.kda_slots, kv.block_size
        # Preemption pops the tail of `running`, never behind the loop's position, and a loop over
        # a list stops at its current length: each request still running is seen once.
        for request in running:
            # The decode row, inline: per request per step, each call here costs measurably.
            computed = request.num_computed_tokens
            output = request.output_token_ids
            if not computed or request.num_prompt_tokens + len(output) - computed != 1:
                continue
            rid = request.request_id
            # A decode's table covers its computed tokens; when the last block is full it grows
            # in place (the same list).
            table = tables[rid]
            if len(table) * block_size <= computed and not self._allocate(request, 1, step):
                continue
            scheduled[rid] = ScheduledRequest(
                rid, request, [output[-1] if output else request.prompt_token_ids[-1]], computed,
                1, True, table, slots[rid], False, True,
            )  # fmt: skip
            step.budget -= 1
        # When every running request got its decode above, none has prefill left: skip the pass.
        i = 0 if len(step.scheduled) < len(self.running) else len(self.running)
        while i < len(self.running) and step.budget > 0:
            request = self.running[i]
            if not _is_decode(request):
                n = min(request.num_tokens - request.num_computed_tokens, step.budget)
                if self._allocate(request, n, step):
                    self._add(step, request, n, is_decode=False)
            i += 1
        # After a preemption the pool is tight: admitting more would only cause more of them.
        while (
            self.waiting
            and not step.preempted
            and step.budget > 0
            and len(self.running) < self.max_num_seqs
        ):
            request = self.waiting[0]
            n = min(request.num_tokens, step.budget)
            if not self.kv_cache_manager.allocate_slots(request, n):
                break
            self.waiting.popleft()
            request.status = RequestStatus.RUNNING
            self.running.append(request)
            self._add(step, request, n, is_decode=False)
        out = SchedulerOutput(list(step.scheduled.values()), step.preempted)
        # An empty step computes nothing, so the engine may skip both the model and the update.
        if out.entries:
            self._pending.append(out)
        return out

    def is_scheduled(self, scheduler_output: SchedulerOutput) -> bool:
        """Whether `scheduler_output` is a scheduled step not yet recorded (nor cancelled)."""
        return any(out is scheduler_output for out in self._pending)

    def cancel_step(self, scheduler_output: SchedulerOutput) -> None:
        """Forget a scheduled step without recording it (its step failed), with any step scheduled
        after it; the caller finishes or requeues their requests."""
        if not self.is_scheduled(scheduler_output):
            raise ValueError("scheduler_output must be a scheduled step not yet recorded")
        while self._pending.pop() is not scheduler_output:
            pass

    def update_from_output(
        self, scheduler_output: SchedulerOutput, sampled: dict[str, list[int]]
    ) -> list[Request]:
        """Record the step: advance the cache, append sampled tokens (one list per sampling row;
        rows of requests finished since `schedule()` may be left out), finish requests on stop
        tokens and length caps. Returns the requests finished here."""
        entries = scheduler_output.entries
        if entries and (not self._pending or scheduler_output is not self._pending[0]):
            raise ValueError("scheduler_output must be the oldest scheduled step not yet recorded")
        rows = {e.request_id for e in entries if e.samples}
        missing = rows - sampled.keys()
        if missing:
            missing -= {e.request_id for e in entries if e.request.is_finished}
        if missing or not sampled.keys() <= rows or not all(sampled.values()):
            raise ValueError(
                f"sampled must map the sampling rows {sorted(rows)} to non-empty token lists, "
                f"got {sorted(sampled)}"
            )
        if entries:
            self._pending.pop(0)
        finished = []
        running, max_len = RequestStatus.RUNNING, self.max_model_len
        for entry in entries:
            request = entry.request
            # Scheduled requests are running unless finished since (`is`: cheaper than the
            # property, per request per step).
            if request.status is not running:
                continue
            request.num_computed_tokens += entry.num_new_tokens
            for token_id in sampled.get(entry.request_id, ()):
                request.append_output_token_id(token_id)
                # Most tokens end nothing: rule that out before the exact rules.
                if (
                    token_id in request.sampling_params.all_stop_token_ids
                    or len(request.output_token_ids) >= request.max_tokens
                    or request.num_prompt_tokens + len(request.output_token_ids) >= max_len
                ):
                    status = self._stop_status(request, token_id)
                    if status is not None:
                        finished.extend(self.finish_requests([request.request_id], status))
                        break
        return finished

    def _stop_status(self, request: Request, token_id: int) -> RequestStatus | None:
        params = request.sampling_params
        num_output = len(request.output_token_ids)
        if num_output >= params.min_tokens and token_id in params.all_stop_token_ids:
            # The eos first, as upstream: a stop list that repeats it still reports None.
            is_eos = token_id == request.eos_token_id and not params.ignore_eos
            in_list = token_id in params.stop_token_ids
            request.stop_reason = token_id if in_list and not is_eos else None
            return RequestStatus.FINISHED_STOPPED
        if num_output >= request.max_tokens or request.num_tokens >= self.max_model_len:
            return RequestStatus.FINISHED_LENGTH_CAPPED
        return None

    def _allocate(self, request: Request, num_new_tokens: int, step: _Step) -> bool:
        """Allocate, preempting from the tail of `running` until it fits; False when `request`
        itself had to be preempted."""
        while not self.kv_cache_manager.allocate_slots(request, num_new_tokens):
            victim = self.running.pop()
            self._preempt(victim, step)
            if victim is request:
                return False
        return True

    def _preempt(self, request: Request, step: _Step) -> None:
        self.kv_cache_manager.free(request)
        # A victim may already hold a row in this step (a decode ahead of a prefill chunk).
        entry = step.scheduled.pop(request.request_id, None)
        if entry is not None:
            step.budget += entry.num_new_tokens
        request.num_computed_tokens = 0
        request.status = RequestStatus.PREEMPTED
        request.num_preemptions += 1
        self.waiting.appendleft(request)
        step.preempted.append(request.request_id)
        logger.debug(
            "preempted %s (%d tokens to recompute)", request.request_id, request.num_tokens
        )

    def _add(self, step: _Step, request: Request, num_new_tokens: int, is_decode: bool) -> None:
        start, end = request.num_computed_tokens, request.num_computed_tokens + num_new_tokens
        rid, kv = request.request_id, self.kv_cache_manager
        # Positional: keyword arguments cost measurably here, per request per step.
        step.scheduled[rid] = ScheduledRequest(
            rid, request, request.token_ids(start, end), start, num_new_tokens, is_decode,
            kv.get_block_table(rid), kv.get_kda_slot(rid), start == 0, end == request.num_tokens,
        )  # fmt: skip
        step.budget -= num_new_tokens
