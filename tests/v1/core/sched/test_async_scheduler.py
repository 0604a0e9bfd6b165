"""AsyncScheduler.schedule_ahead: a decode step's continuation, scheduled while the step is in
flight, only when it is what `schedule()` would give once the step is recorded."""

import pytest

from vllm.sampling_params import SamplingParams
from vllm.v1.core.kv_cache_manager import KVCacheManager
from vllm.v1.core.sched.async_scheduler import AsyncScheduler
from vllm.v1.core.sched.output import SchedulerOutput
from vllm.v1.request import Request, RequestStatus

EOS = 0


def _request(request_id: str, prompt_len: int, max_tokens: int = 8) -> Request:
    params = SamplingParams()
    params.update_from_tokenizer(EOS)
    return Request(request_id, list(range(100, 100 + prompt_len)), params, EOS, max_tokens, 0)


def _scheduler(num_blocks: int = 64, block_size: int = 4, max_model_len: int = 256):
    kv = KVCacheManager(num_blocks, block_size, num_kda_slots=9)
    return AsyncScheduler(8, 64, max_model_len, kv)


def _record(sched: AsyncScheduler, out: SchedulerOutput, token: int = 7) -> list[Request]:
    sampled = {e.request_id: [token] for e in out.entries if e.samples}
    return sched.update_from_output(out, sampled)


def _decoding(sched: AsyncScheduler, *requests: Request) -> SchedulerOutput:
    """Prefill the requests, record it, and schedule their first decode step (in flight)."""
    for request in requests:
        sched.add_request(request)
    _record(sched, sched.schedule())
    out = sched.schedule()
    assert all(e.is_decode for e in out.entries)
    return out


def test_continuation_is_what_schedule_gives_after_the_step():
    sched = _scheduler(block_size=4)
    a, b = _request("a", 3), _request("b", 6)
    step = _decoding(sched, a, b)
    ahead = sched.schedule_ahead(step)
    assert ahead is not None and ahead.follows and not step.follows
    assert [e.request_id for e in ahead.entries] == ["a", "b"]
    assert [e.num_computed_tokens for e in ahead.entries] == [4, 7]
    assert all(e.is_decode and e.samples and e.token_ids == [] for e in ahead.entries)
    # a's continuation writes position 4: its table grew to a second block.
    assert len(sched.kv_cache_manager.get_block_table("a")) == 2
    assert [e.kda_slot for e in ahead.entries] == [e.kda_slot for e in step.entries]
    _record(sched, step, token=11)
    _record(sched, ahead, token=12)
    assert (a.num_computed_tokens, a.output_token_ids) == (5, [7, 11, 12])
    # After both, the plain schedule continues from there.
    nxt = sched.schedule()
    assert [(e.request_id, e.num_computed_tokens, e.token_ids) for e in nxt.entries] == [
        ("a", 5, [12]), ("b", 8, [12])
    ]  # fmt: skip


def test_steps_are_recorded_oldest_first():
    sched = _scheduler()
    step = _decoding(sched, _request("a", 3))
    ahead = sched.schedule_ahead(step)
    with pytest.raises(ValueError, match="oldest"):
        _record(sched, ahead)
    with pytest.raises(ValueError, match="only scheduled step"):
        sched.schedule_ahead(ahead)
    with pytest.raises(RuntimeError, match="before update_from_output"):
        sched.schedule()


def test_cancelling_the_step_in_flight_cancels_its_continuation():
    sched = _scheduler()
    step = _decoding(sched, _request("a", 3))
    sched.schedule_ahead(step)
    sched.cancel_step(step)
    assert sched.schedule().entries  # nothing left pending


@pytest.mark.parametrize("case", ["waiting", "prefill", "max_tokens", "max_model_len", "cache"])
def test_no_continuation_when_schedule_would_differ(case):
    sched = _scheduler(
        max_model_len=5 if case == "max_model_len" else 256,
        # Three usable blocks of 4 tokens: each prompt of 3 takes one; the step's token (position
        # 3) still fits, the continuations' (position 4) would need two more, one is left.
        num_blocks=4 if case == "cache" else 64,
    )
    requests = [_request("a", 3, max_tokens=2 if case == "max_tokens" else 4)]
    if case == "cache":
        requests.append(_request("b", 3, max_tokens=4))
    step = _decoding(sched, *requests)
    if case == "waiting":
        sched.add_request(_request("w", 3))
    if case == "prefill":
        sched.cancel_step(step)
        sched.add_request(_request("p", 40))
        step = sched.schedule()  # a's decode and p's prefill chunk
    free = sched.kv_cache_manager.num_free_blocks
    assert sched.schedule_ahead(step) is None
    assert sched.kv_cache_manager.num_free_blocks == free
    # The step is still the one to record.
    _record(sched, step)


def test_a_sequence_ending_by_length_keeps_its_row_while_others_go_on():
    sched = _scheduler()
    a, b = _request("a", 3, max_tokens=2), _request("b", 3, max_tokens=8)
    step = _decoding(sched, a, b)
    ahead = sched.schedule_ahead(step)
    assert [e.request_id for e in ahead.entries] == ["a", "b"]
    assert [r.request_id for r in _record(sched, step)] == ["a"]
    # The engine leaves the ended row's sample out when it records the continuation.
    assert sched.update_from_output(ahead, {"b": [9]}) == []
    assert (a.output_token_ids, b.output_token_ids) == ([7, 7], [7, 7, 9])
    assert a.num_computed_tokens == 4 and b.num_computed_tokens == 5


def test_waiting_requests_do_not_stop_a_full_batch():
    kv = KVCacheManager(64, 4, num_kda_slots=3)
    sched = AsyncScheduler(1, 64, 256, kv)
    step = _decoding(sched, _request("a", 3))
    sched.add_request(_request("w", 3))  # max_num_seqs 1: schedule() would not admit it
    ahead = sched.schedule_ahead(step)
    assert [e.request_id for e in ahead.entries] == ["a"]


def test_no_continuation_for_a_sequence_finished_since():
    sched = _scheduler()
    step = _decoding(sched, _request("a", 3), _request("b", 3))
    sched.finish_requests("b", RequestStatus.FINISHED_ABORTED)
    assert sched.schedule_ahead(step) is None
