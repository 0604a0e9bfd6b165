"""Scheduler: decodes first, chunked prefill, admission limits, preemption, aborts, stops."""

import pytest

from vllm.sampling_params import SamplingParams
from vllm.v1.core.kv_cache_manager import KVCacheManager
from vllm.v1.core.sched.output import SchedulerOutput
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.request import Request, RequestStatus

EOS = 0


def _request(
    request_id: str, prompt: list[int] | int, max_tokens: int = 8, **params: object
) -> Request:
    prompt_ids = list(range(100, 100 + prompt)) if isinstance(prompt, int) else prompt
    sampling_params = SamplingParams(**params)
    sampling_params.update_from_tokenizer(EOS)
    return Request(request_id, prompt_ids, sampling_params, EOS, max_tokens, 0)


def _scheduler(
    budget: int = 64,
    max_num_seqs: int = 8,
    num_blocks: int = 64,
    block_size: int = 4,
    max_model_len: int = 256,
) -> Scheduler:
    kv = KVCacheManager(num_blocks, block_size, num_kda_slots=max_num_seqs + 1)
    return Scheduler(max_num_seqs, budget, max_model_len, kv)


def _step(sched: Scheduler, token: int = 7) -> tuple[SchedulerOutput, list[Request]]:
    """Schedule and feed back `token` for every sampling row."""
    out = sched.schedule()
    sampled = {e.request_id: [token] for e in out.entries if e.samples}
    return out, sched.update_from_output(out, sampled)


def _rows(out: SchedulerOutput) -> list[tuple[str, int, bool]]:
    return [(e.request_id, e.num_new_tokens, e.is_decode) for e in out.entries]


def _assert_all_free(sched: Scheduler) -> None:
    kv = sched.kv_cache_manager
    assert kv.num_free_blocks == kv.initial_num_free_blocks
    assert kv.num_free_kda_slots == kv.initial_num_free_kda_slots


def test_decodes_first_then_chunked_prefill():
    sched = _scheduler(budget=8)
    sched.add_request(_request("a", 3, max_tokens=3))
    sched.add_request(_request("b", 2))
    out, _ = _step(sched)
    assert _rows(out) == [("a", 3, False), ("b", 2, False)]
    sched.add_request(_request("c", 20))
    out = sched.schedule()
    assert _rows(out) == [("a", 1, True), ("b", 1, True), ("c", 6, False)]
    assert (out.num_decodes, out.total_num_scheduled_tokens) == (2, 8)
    assert [e.samples for e in out.entries] == [True, True, False]
    assert out.entries[2].token_ids == list(range(100, 106)) and out.entries[2].is_new_slot
    assert not out.entries[0].is_new_slot and out.entries[0].token_ids == [7]


def test_several_prompts_in_one_step_then_decodes():
    sched = _scheduler(budget=16)
    for i, n in enumerate((3, 4, 5)):
        sched.add_request(_request(f"r{i}", n))
    out, _ = _step(sched)
    assert _rows(out) == [("r0", 3, False), ("r1", 4, False), ("r2", 5, False)]
    assert all(e.samples and e.is_new_slot for e in out.entries)
    assert len({e.kda_slot for e in out.entries}) == 3
    out, _ = _step(sched)
    assert _rows(out) == [("r0", 1, True), ("r1", 1, True), ("r2", 1, True)]
    assert [e.num_computed_tokens for e in out.entries] == [3, 4, 5]


def test_max_num_seqs_limits_admission():
    sched = _scheduler(budget=32, max_num_seqs=2)
    sched.add_request(_request("a", 2, max_tokens=1))
    sched.add_request(_request("b", 2, max_tokens=3))
    sched.add_request(_request("c", 2))
    out, finished = _step(sched)
    assert [e.request_id for e in out.entries] == ["a", "b"]
    assert [r.request_id for r in finished] == ["a"]
    assert (sched.num_running, sched.num_waiting) == (1, 1)
    out, _ = _step(sched)
    assert _rows(out) == [("b", 1, True), ("c", 2, False)]


def test_long_prompt_is_chunked_over_steps():
    sched = _scheduler(budget=10)
    prompt = list(range(1, 26))
    sched.add_request(_request("long", prompt))
    chunks = []
    for _ in range(3):
        out, _ = _step(sched)
        (entry,) = out.entries
        chunks.append((entry.num_computed_tokens, entry.num_new_tokens, entry.samples))
        assert entry.token_ids == prompt[entry.num_computed_tokens : entry.num_computed_tokens + 10]
        assert entry.is_new_slot == (entry.num_computed_tokens == 0) and not entry.is_decode
        assert len(entry.block_table) * 4 >= entry.num_computed_tokens + entry.num_new_tokens
    assert chunks == [(0, 10, False), (10, 10, False), (20, 5, True)]
    out, _ = _step(sched)
    assert _rows(out) == [("long", 1, True)]
    assert out.entries[0].num_computed_tokens == 25


def test_one_token_prompt_is_a_prefill_first():
    sched = _scheduler()
    sched.add_request(_request("one", [42]))
    out, _ = _step(sched)
    (entry,) = out.entries
    assert not entry.is_decode and entry.is_new_slot and entry.samples
    assert (entry.token_ids, out.num_decodes) == ([42], 0)
    out, _ = _step(sched)
    assert _rows(out) == [("one", 1, True)] and not out.entries[0].is_new_slot


def test_preempted_request_recomputes_all_its_tokens_then_decodes():
    # Four usable blocks of two tokens.
    sched = _scheduler(budget=16, num_blocks=5, block_size=2)
    sched.add_request(_request("a", [1, 2, 3], max_tokens=4))
    sched.add_request(_request("b", [4, 5, 6], max_tokens=4))
    _step(sched, token=10)
    out, _ = _step(sched, token=11)
    assert _rows(out) == [("a", 1, True), ("b", 1, True)]
    out, _ = _step(sched, token=12)  # a needs a third block: b, the newest, goes
    assert _rows(out) == [("a", 1, True)] and out.preempted_request_ids == ["b"]
    b = sched.waiting[0]
    assert (b.request_id, b.status, b.num_computed_tokens) == ("b", RequestStatus.PREEMPTED, 0)
    assert b.output_token_ids == [10, 11] and b.num_preemptions == 1
    out, finished = _step(sched, token=13)  # b cannot come back while a holds three blocks
    assert _rows(out) == [("a", 1, True)] and [r.request_id for r in finished] == ["a"]
    out, _ = _step(sched, token=20)
    (entry,) = out.entries
    assert (entry.request_id, entry.token_ids) == ("b", [4, 5, 6, 10, 11])
    assert entry.is_new_slot and entry.samples and not entry.is_decode
    out, finished = _step(sched, token=21)
    assert _rows(out) == [("b", 1, True)]
    assert finished == [b] and b.output_token_ids == [10, 11, 20, 21]
    assert b.finish_reason == "length"
    _assert_all_free(sched)


def test_newest_decode_preempts_itself():
    sched = _scheduler(budget=16, num_blocks=5, block_size=2)
    sched.add_request(_request("a", 3, max_tokens=3))
    sched.add_request(_request("b", 4, max_tokens=2))
    _step(sched)
    out, _ = _step(sched)
    assert _rows(out) == [("a", 1, True)] and out.preempted_request_ids == ["b"]
    assert sched.waiting[0].request_id == "b"


def test_prefill_preemption_unschedules_a_decode_of_the_step():
    # Several tokens per row (e.g. speculative) leave the older request three tokens to compute.
    sched = _scheduler(budget=4, max_num_seqs=2, num_blocks=7, block_size=1)
    sched.add_request(_request("a", 2, max_tokens=5))
    sched.add_request(_request("b", 2, max_tokens=2))
    out = sched.schedule()
    sched.update_from_output(out, {"a": [7, 8, 9], "b": [5]})
    out = sched.schedule()
    assert _rows(out) == [("a", 3, False)] and out.preempted_request_ids == ["b"]
    assert out.entries[0].token_ids == [7, 8, 9] and out.entries[0].samples
    assert sched.kv_cache_manager.num_free_blocks == 1


@pytest.mark.parametrize("state", ["waiting", "running", "in_flight", "preempted"])
def test_abort_in_any_state_frees_everything(state):
    sched = _scheduler(budget=16, num_blocks=5, block_size=2)
    sched.add_request(_request("a", 3, max_tokens=3))
    sched.add_request(_request("b", 4, max_tokens=2))
    # In flight, b preempts itself (see above), so the row being computed is a's decode.
    victim = "a" if state == "in_flight" else "b"
    if state != "waiting":
        _step(sched)
    if state == "preempted":
        _step(sched)
        assert sched.waiting[0].status == RequestStatus.PREEMPTED
    out = sched.schedule() if state == "in_flight" else None
    if out is not None:
        assert victim in [e.request_id for e in out.entries]
    (request,) = sched.finish_requests([victim], RequestStatus.FINISHED_ABORTED)
    assert request.is_finished and request.finish_reason == "abort"
    assert sched.finish_requests(victim, RequestStatus.FINISHED_ABORTED) == []
    if out is not None:
        # The aborted row's token may be left out (the soak test passes it in).
        assert sched.update_from_output(out, {}) == []
        assert request.num_computed_tokens == 3 and request.output_token_ids == [7]
    assert sched.get_num_unfinished_requests() == 1
    (other,) = sched.finish_requests(["a", "b"], RequestStatus.FINISHED_ERROR)
    assert other.finish_reason == "error"
    assert not sched.has_unfinished_requests() and sched.schedule().entries == []
    _assert_all_free(sched)


def test_stop_tokens_respect_min_tokens_and_ignore_eos():
    sched = _scheduler()
    sched.add_request(_request("eos", 2))
    sched.add_request(_request("stop_id", 2, stop_token_ids=[9]))
    sched.add_request(_request("min", 2, min_tokens=2))
    sched.add_request(_request("ignore", 2, max_tokens=2, ignore_eos=True))
    out = sched.schedule()
    finished = sched.update_from_output(
        out, {"eos": [EOS], "stop_id": [9], "min": [EOS], "ignore": [EOS]}
    )
    assert [(r.request_id, r.stop_reason) for r in finished] == [("eos", None), ("stop_id", 9)]
    assert all(r.status == RequestStatus.FINISHED_STOPPED for r in finished)
    out = sched.schedule()
    finished = sched.update_from_output(out, {"min": [EOS], "ignore": [EOS]})
    assert [(r.request_id, r.finish_reason) for r in finished] == [
        ("min", "stop"),
        ("ignore", "length"),
    ]
    _assert_all_free(sched)


def test_max_model_len_caps_the_sequence():
    sched = _scheduler(max_model_len=6)
    sched.add_request(_request("r", 4, max_tokens=100))
    finished = []
    while not finished:
        _, finished = _step(sched)
    assert finished[0].num_tokens == 6 and finished[0].finish_reason == "length"


def test_several_tokens_per_row_stop_at_the_first_stop():
    sched = _scheduler()
    sched.add_request(_request("r", 2, max_tokens=3))
    out = sched.schedule()
    (request,) = sched.update_from_output(out, {"r": [5, 6, 7, 8]})
    assert request.output_token_ids == [5, 6, 7] and request.finish_reason == "length"


def test_bad_input_is_refused():
    sched = _scheduler(num_blocks=3, block_size=4, max_model_len=32)
    with pytest.raises(ValueError, match="max_model_len"):
        sched.add_request(_request("too_long", 32))
    with pytest.raises(ValueError, match="cache"):
        sched.add_request(_request("too_big", 8, max_tokens=2))  # 9 tokens, 8 fit
    sched.add_request(_request("ok", 8, max_tokens=1))
    with pytest.raises(ValueError, match="already"):
        sched.add_request(_request("ok", 2))
    with pytest.raises(ValueError, match="status"):
        sched.finish_requests(["ok"], RequestStatus.RUNNING)
    out = sched.schedule()
    with pytest.raises(RuntimeError):
        sched.schedule()
    with pytest.raises(ValueError, match="sampled"):
        sched.update_from_output(out, {})
    assert sched.update_from_output(out, {"ok": [3]})[0].finish_reason == "length"
    with pytest.raises(ValueError, match="scheduler_output"):
        sched.update_from_output(out, {"ok": [3]})
    # Nothing to run: the engine may skip the model and the update, and schedule again.
    assert sched.schedule().entries == [] and sched.schedule().entries == []
    assert sched.update_from_output(SchedulerOutput([]), {}) == []
    with pytest.raises(ValueError, match="max_num_batched_tokens"):
        Scheduler(8, 4, 32, sched.kv_cache_manager)
    with pytest.raises(ValueError, match="max_tokens"):
        _request("zero", 2, max_tokens=0)
    with pytest.raises(ValueError, match="prompt_token_ids"):
        _request("empty", [])


def test_request_token_ids_slice_the_prompt_then_the_output():
    request = _request("r", [1, 2, 3, 4])
    for token in (5, 6, 7):
        request.append_output_token_id(token)
    every = [1, 2, 3, 4, 5, 6, 7]
    assert request.num_tokens == 7 and request.token_ids(0, 7) == every
    for start in range(8):
        for end in range(start, 8):
            assert request.token_ids(start, end) == every[start:end], (start, end)
    # A list the caller may keep: not the request's output itself.
    request.token_ids(4, 7).append(8)
    assert request.output_token_ids == [5, 6, 7]
