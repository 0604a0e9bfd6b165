"""Randomized soak: a fake model that keeps real-looking caches checks every step the scheduler
hands it, while requests arrive, stop, hit their lengths, get preempted and get aborted."""

import random

import pytest

from vllm.sampling_params import SamplingParams
from vllm.v1.core.kv_cache_manager import PAD_BLOCK_ID, PAD_KDA_SLOT, KVCacheManager
from vllm.v1.core.sched.output import SchedulerOutput
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.request import Request, RequestStatus

VOCAB = 64
EOS = 0
MAX_MODEL_LEN = 64


class FakeModel:
    """Stores each token at its (block, offset) like the MLA cache and the token history per slot
    like the KDA state, then checks that what a row can see is exactly its request's tokens."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        self.latents: dict[tuple[int, int], int] = {}
        self.states: dict[int, list[int]] = {}

    def step(self, out: SchedulerOutput, block_size: int) -> dict[str, list[int]]:
        sampled = {}
        for e in out.entries:
            tokens = e.request.token_ids(0, e.request.num_tokens)
            end = e.num_computed_tokens + e.num_new_tokens
            assert e.token_ids == tokens[e.num_computed_tokens : end]
            assert PAD_BLOCK_ID not in e.block_table and e.kda_slot != PAD_KDA_SLOT
            assert len(e.block_table) * block_size >= end
            if e.is_new_slot:
                self.states[e.kda_slot] = []
            assert self.states[e.kda_slot] == tokens[: e.num_computed_tokens]
            self.states[e.kda_slot] += e.token_ids
            for pos in range(e.num_computed_tokens, end):
                self.latents[e.block_table[pos // block_size], pos % block_size] = tokens[pos]
            if e.samples:
                seen = [
                    self.latents[e.block_table[p // block_size], p % block_size] for p in range(end)
                ]
                assert seen == tokens[:end]
                count = 1 if self.rng.random() < 0.9 else self.rng.randint(2, 3)
                sampled[e.request_id] = [self.rng.randrange(VOCAB) for _ in range(count)]
        return sampled


def _random_request(rng: random.Random, index: int) -> Request:
    max_tokens = rng.randint(1, 30)
    params = SamplingParams(
        min_tokens=rng.randint(0, min(3, max_tokens)),
        ignore_eos=rng.random() < 0.3,
        stop_token_ids=rng.sample(range(1, VOCAB), rng.randint(0, 2)),
    )
    params.update_from_tokenizer(EOS)
    prompt = [rng.randrange(VOCAB) for _ in range(rng.randint(1, 40))]
    return Request(f"r{index}", prompt, params, EOS, max_tokens, index)


def _check_invariants(sched: Scheduler, out: SchedulerOutput) -> None:
    kv = sched.kv_cache_manager
    assert out.total_num_scheduled_tokens <= sched.max_num_batched_tokens
    assert len(out.entries) <= sched.max_num_seqs and sched.num_running <= sched.max_num_seqs
    flags = [e.is_decode for e in out.entries]
    assert flags == sorted(flags, reverse=True), "decodes come first"
    assert len({e.request_id for e in out.entries}) == len(out.entries)
    assert all(e.request.status == RequestStatus.RUNNING for e in out.entries)
    assert not set(out.preempted_request_ids) & {e.request_id for e in out.entries}
    tables = [kv.get_block_table(r.request_id) for r in sched.running]
    blocks = [b for t in tables for b in t]
    assert len(blocks) == len(set(blocks)), "running requests share a block"
    assert len(blocks) + kv.num_free_blocks == kv.initial_num_free_blocks
    slots = [kv.get_kda_slot(r.request_id) for r in sched.running]
    assert len(slots) == len(set(slots))
    assert len(slots) + kv.num_free_kda_slots == kv.initial_num_free_kda_slots
    assert sched.num_running + sched.num_waiting == sched.get_num_unfinished_requests()


def _check_finish(request: Request) -> None:
    params = request.sampling_params
    num_output = len(request.output_token_ids)
    if request.status == RequestStatus.FINISHED_STOPPED:
        assert request.output_token_ids[-1] in params.all_stop_token_ids
        assert num_output >= params.min_tokens
    else:
        assert request.status == RequestStatus.FINISHED_LENGTH_CAPPED
        assert num_output == request.max_tokens or request.num_tokens == MAX_MODEL_LEN
    assert num_output <= request.max_tokens and request.num_tokens <= MAX_MODEL_LEN


@pytest.mark.parametrize("seed", range(6))
def test_soak(seed: int) -> None:
    rng = random.Random(seed)
    block_size = rng.choice([1, 2, 4, 16])
    min_blocks = -(-(MAX_MODEL_LEN - 1) // block_size)
    kv = KVCacheManager(
        num_blocks=1 + min_blocks + rng.randint(0, min_blocks // 2),
        block_size=block_size,
        num_kda_slots=rng.randint(3, 9),
    )
    max_num_seqs = rng.randint(2, 8)
    sched = Scheduler(max_num_seqs, rng.randint(max_num_seqs, 48), MAX_MODEL_LEN, kv)
    model = FakeModel(rng)
    requests: list[Request] = []
    aborted: set[str] = set()
    num_steps = 0
    while len(requests) < 150 or sched.has_unfinished_requests():
        num_steps += 1
        assert num_steps < 20_000, "the scheduler stopped making progress"
        while len(requests) < 150 and rng.random() < 0.3:
            requests.append(_random_request(rng, len(requests)))
            sched.add_request(requests[-1])
        if sched.requests and rng.random() < 0.02:
            request_id = rng.choice(sorted(sched.requests))
            sched.finish_requests([request_id], RequestStatus.FINISHED_ABORTED)
            aborted.add(request_id)
        out = sched.schedule()
        _check_invariants(sched, out)
        sampled = model.step(out, block_size)
        if out.entries and rng.random() < 0.02:
            in_flight = rng.choice(out.entries).request_id
            aborted.update(
                r.request_id
                for r in sched.finish_requests([in_flight], RequestStatus.FINISHED_ABORTED)
            )
        for request in sched.update_from_output(out, sampled):
            _check_finish(request)
    assert num_steps > 500
    assert all(r.is_finished for r in requests)
    assert {r.request_id for r in requests if r.status == RequestStatus.FINISHED_ABORTED} == aborted
    assert sum(r.num_preemptions for r in requests) > 0
    assert kv.num_free_blocks == kv.initial_num_free_blocks
    assert kv.num_free_kda_slots == kv.initial_num_free_kda_slots
