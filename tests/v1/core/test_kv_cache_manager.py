"""KVCacheManager: reserved block/slot 0, all-or-nothing allocation, counters that return."""

import pytest

from vllm.sampling_params import SamplingParams
from vllm.v1.core.kv_cache_manager import PAD_BLOCK_ID, PAD_KDA_SLOT, KVCacheManager
from vllm.v1.request import Request


def _request(request_id: str, num_tokens: int = 4) -> Request:
    return Request(request_id, list(range(num_tokens)), SamplingParams(), None, 8, 0)


def test_reserved_block_and_slot_are_never_handed_out():
    kv = KVCacheManager(num_blocks=5, block_size=2, num_kda_slots=3)
    assert (kv.initial_num_free_blocks, kv.initial_num_free_kda_slots) == (4, 2)
    a, b = _request("a"), _request("b")
    assert kv.allocate_slots(a, 4) and kv.allocate_slots(b, 4)
    blocks = kv.get_block_table("a") + kv.get_block_table("b")
    assert sorted(blocks) == [1, 2, 3, 4] and PAD_BLOCK_ID not in blocks
    assert {kv.get_kda_slot("a"), kv.get_kda_slot("b")} == {1, 2}
    assert PAD_KDA_SLOT not in {kv.get_kda_slot("a"), kv.get_kda_slot("b")}
    assert kv.num_free_blocks == 0 and kv.usage == 1.0


def test_allocation_grows_the_table_and_keeps_the_slot():
    kv = KVCacheManager(num_blocks=8, block_size=4, num_kda_slots=4)
    r = _request("r", 12)
    assert kv.allocate_slots(r, 5)
    table = kv.get_block_table("r")
    first = list(table)
    assert len(table) == 2
    slot = kv.get_kda_slot("r")
    r.num_computed_tokens = 5
    assert kv.allocate_slots(r, 3)  # 8 tokens still fit two blocks
    assert len(kv.get_block_table("r")) == 2
    assert kv.allocate_slots(r, 4)
    # The live table grows in place by appending (the metadata builder reads only its tail).
    assert kv.get_block_table("r") is table and len(table) == 3 and table[:2] == first
    assert kv.get_kda_slot("r") == slot and kv.num_free_kda_slots == 2
    assert kv.usage == pytest.approx(3 / 7)


def test_allocation_is_all_or_nothing():
    kv = KVCacheManager(num_blocks=4, block_size=2, num_kda_slots=2)
    a, b = _request("a"), _request("b")
    assert not kv.allocate_slots(a, 7)  # 4 blocks, 3 usable
    assert (kv.num_free_blocks, kv.num_free_kda_slots) == (3, 1)
    assert kv.get_block_table("a") == []
    assert kv.allocate_slots(a, 2)
    assert not kv.allocate_slots(b, 1)  # blocks left, but no slot
    assert (kv.num_free_blocks, kv.num_free_kda_slots) == (2, 0)
    assert kv.get_block_table("b") == []
    with pytest.raises(ValueError, match="request_id"):
        kv.get_kda_slot("b")


def test_free_returns_everything_and_is_idempotent():
    kv = KVCacheManager(num_blocks=6, block_size=1, num_kda_slots=3)
    a, b = _request("a"), _request("b")
    assert kv.allocate_slots(a, 3) and kv.allocate_slots(b, 2)
    kv.free(a)
    kv.free(a)
    assert (kv.num_free_blocks, kv.num_free_kda_slots) == (3, 1)
    kv.free(b)
    assert kv.num_free_blocks == kv.initial_num_free_blocks
    assert kv.num_free_kda_slots == kv.initial_num_free_kda_slots
    assert kv.usage == 0.0
    # A table freed and allocated again is a new list: a holder of the old one never sees it
    # change (the metadata builder trusts a list it has seen to grow only).
    assert kv.allocate_slots(a, 2)
    old = kv.get_block_table("a")
    kv.free(a)
    assert kv.allocate_slots(a, 1)
    assert kv.get_block_table("a") is not old and len(old) == 2


@pytest.mark.parametrize(
    "kwargs, name",
    [
        ({"num_blocks": 1, "block_size": 2, "num_kda_slots": 2}, "num_blocks"),
        ({"num_blocks": 4, "block_size": 0, "num_kda_slots": 2}, "block_size"),
        ({"num_blocks": 4, "block_size": 2, "num_kda_slots": 1}, "num_kda_slots"),
        ({"num_blocks": 4, "block_size": True, "num_kda_slots": 2}, "block_size"),
    ],
)
def test_bad_construction_names_the_argument(kwargs, name):
    with pytest.raises(ValueError, match=name):
        KVCacheManager(**kwargs)


def test_bad_num_new_tokens():
    kv = KVCacheManager(num_blocks=4, block_size=2, num_kda_slots=2)
    with pytest.raises(ValueError, match="num_new_tokens"):
        kv.allocate_slots(_request("a"), 0)
