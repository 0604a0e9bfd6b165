"""The engine <-> model seam: `KimiMetadataBuilder` validation and padding, cache specs against
the allocated caches, binding, new sequences on reused slots, the empty batch."""

import random

import numpy as np
import pytest
import torch
from engine_harness import EngineHarness
from hf_kimi_linear import TINY, random_hf_model
from test_amd_model import load_ours

from vllm.models.kimi_k3.amd.metadata import BatchSchedule, KimiMetadataBuilder
from vllm.v1.kv_cache_interface import KDAStateSpec, MLAAttentionSpec, allocate_kv_caches

BLOCK = 4

pytestmark = pytest.mark.usefixtures("interpreter_moe_blocks")


def builder(**changes) -> KimiMetadataBuilder:
    args = dict(
        max_num_tokens=16, max_num_seqs=4, max_blocks_per_seq=3, block_size=BLOCK, num_blocks=10,
        num_kda_slots=5, device="cpu",
    )  # fmt: skip
    return KimiMetadataBuilder(**dict(args, **changes))


def seq(num_computed, num_new, table, slot) -> tuple[int, int, list[int], int]:
    return num_computed, num_new, table, slot


def batch(seqs: list[tuple[int, int, list[int], int]], num_decodes: int) -> BatchSchedule:
    """The rows `seqs` (from `seq`) as the builder's columns."""
    columns = [list(column) for column in zip(*seqs, strict=True)] if seqs else [[]] * 4
    return BatchSchedule(*columns, num_decodes)


@pytest.fixture(scope="module")
def model(hf_kimi_linear, tmp_path_factory):
    folder = tmp_path_factory.mktemp("kimi_linear_seam")
    random_hf_model(hf_kimi_linear).save_pretrained(folder)
    return load_ours(folder)


# ---------------------------------------------------------------------------------------------
# Builder: validation, layout, padding
# ---------------------------------------------------------------------------------------------

DECODE = seq(3, 1, [1], 1)
INVALID = {
    "decode with two tokens": ([seq(3, 2, [1, 2], 1)], 1, None, "batch row 0 is a decode"),
    "decode of a new sequence": ([seq(0, 1, [1], 1)], 1, None, "batch row 0 is a decode"),
    "prefill of no tokens": ([DECODE, seq(0, 0, [2], 2)], 1, None, "batch row 1: num_new"),
    "num_decodes past the batch": ([DECODE], 2, None, "num_decodes must be in"),
    "too many tokens": ([seq(0, 9, [1, 2, 3], 1), seq(0, 8, [4, 5], 2)], 0, None, "max_num_tok"),
    "too many sequences": ([seq(0, 1, [b], b) for b in range(1, 6)], 0, None, "max_num_seqs"),
    "dummy kda slot": ([seq(0, 2, [1], 0)], 0, None, "kda_slots\\[0\\] 0 is outside \\[1, 5\\)"),
    "kda slot past the pool": ([seq(0, 2, [1], 5)], 0, None, "kda_slots\\[0\\] 5 is outside"),
    "shared kda slot": ([seq(0, 2, [1], 2), seq(0, 2, [3], 2)], 0, None, "used by another"),
    "dummy block": ([seq(0, 2, [0], 1)], 0, None, "block outside \\[1, 10\\)"),
    "block past the cache": ([seq(0, 2, [10], 1)], 0, None, "block outside"),
    "bad block before a good one": ([seq(0, 2, [10, 3], 1)], 0, None, "block outside"),
    "too few blocks": ([seq(2, 3, [1], 1)], 0, None, "do not hold 5 tokens"),
    "table too long": ([seq(0, 2, [1, 2, 3, 4], 1)], 0, None, "more than max_blocks_per_seq"),
    "padding a prefill": ([DECODE, seq(0, 2, [2], 2)], 1, 3, "only a decode-only batch"),
    "padding below N": ([DECODE, seq(5, 1, [2, 3], 2)], 2, 1, "pad_to must be in \\[2, 4\\]"),
    "padding past max_num_seqs": ([DECODE], 1, 5, "pad_to must be in \\[1, 4\\]"),
}


@pytest.mark.parametrize("case", list(INVALID))
def test_invalid_schedules_are_refused_at_build_time(case):
    seqs, num_decodes, pad_to, message = INVALID[case]
    with pytest.raises(ValueError, match=message):
        builder().build(batch(seqs, num_decodes), pad_to)


def test_columns_of_different_lengths_are_refused():
    with pytest.raises(ValueError, match="one per sequence each"):
        builder().build(BatchSchedule([3, 4], [1, 1], [[1], [2]], [1], 2))


def test_builder_arguments_are_checked():
    with pytest.raises(ValueError, match="num_blocks must be >= 2"):
        builder(num_blocks=1)
    with pytest.raises(ValueError, match="num_kda_slots must be >= 2"):
        builder(num_kda_slots=1)


def test_layout_decodes_first_then_prefills():
    b = builder()
    meta = b.build(batch([seq(5, 1, [7, 2], 3), seq(2, 3, [4, 9], 1), seq(0, 2, [6], 4)], 1))
    kda, mla = meta.kda, meta.mla
    assert meta.num_tokens == 6
    assert kda.query_start_loc.tolist() == [0, 1, 4, 6]
    assert kda.state_slots.tolist() == [3, 1, 4]
    assert kda.has_initial_state.tolist() == [True, True, False]
    assert (kda.num_decodes, kda.num_prefills) == (1, 2)
    assert kda.prefill_query_start_loc.tolist() == [0, 3, 5]
    assert kda.prefill_query_start_loc.dtype == torch.int64  # fla-core's offsets, as handed over
    # position 5 of [7, 2] is block 2 offset 1; positions 2..4 of [4, 9]; positions 0, 1 of [6]
    assert mla.slot_mapping.tolist() == [9, 18, 19, 36, 24, 25]
    assert mla.decode_block_tables.tolist() == [[7, 2, 0]]
    assert mla.decode_seq_lens.tolist() == [6]
    (s1, e1, slots1), (s2, e2, slots2) = mla.prefills
    assert (s1, e1, s2, e2) == (1, 4, 4, 6)
    assert slots1.tolist() == [16, 17, 18, 19, 36] and slots2.tolist() == [24, 25]
    # A prompt with nothing cached reads its slots from the step's slot mapping, in place.
    assert slots2.data_ptr() == mla.slot_mapping[4:].data_ptr()


def test_padded_rows_use_only_the_dummies_and_buffers_are_reused():
    b = builder()
    first = b.build(batch([seq(0, 3, [5], 2)], 0))
    meta = b.build(batch([seq(5, 1, [7, 2], 3), seq(1, 1, [4], 1)], 2), pad_to=4)
    assert meta.num_tokens == 4
    assert meta.kda.num_decodes == meta.mla.num_decodes == 4 and meta.kda.num_prefills == 0
    assert meta.kda.state_slots.tolist() == [3, 1, 0, 0]
    assert meta.mla.decode_block_tables.tolist() == [[7, 2, 0], [4, 0, 0], [0, 0, 0], [0, 0, 0]]
    assert meta.mla.decode_seq_lens.tolist() == [6, 2, 1, 1]
    assert meta.mla.slot_mapping.tolist() == [9, 17, 0, 0]
    assert meta.kda.query_start_loc.tolist() == [0, 1, 2, 3, 4]
    # CUDA-graph static inputs: every build writes the same storage
    for a, c in (
        (first.kda.state_slots, meta.kda.state_slots),
        (first.kda.query_start_loc, meta.kda.query_start_loc),
        (first.mla.slot_mapping, meta.mla.slot_mapping),
        (first.mla.decode_block_tables, meta.mla.decode_block_tables),
    ):
        assert a.untyped_storage().data_ptr() == c.untyped_storage().data_ptr()


def test_rows_rewritten_only_where_tables_change_and_ids_staged():
    b = builder()
    b.build(batch([seq(9, 1, [7, 2, 3], 3), seq(1, 1, [4], 1)], 2))
    # Row 0 gets a shorter table (its old tail must go), row 1 keeps its own.
    meta = b.build(batch([seq(1, 1, [5], 2), seq(2, 1, [4], 1)], 2), input_ids=np.array([6, 8]))
    assert meta.mla.decode_block_tables.tolist() == [[5, 0, 0], [4, 0, 0]]
    assert meta.mla.slot_mapping.tolist() == [21, 18]
    assert b.input_ids[:2].tolist() == [6, 8]
    assert b.stage(batch([seq(2, 1, [5], 2)], 1), pad_to=2, input_ids=np.array([3])) == 2
    assert b.block_tables[:2].tolist() == [[5, 0, 0], [0, 0, 0]] and b.input_ids[0] == 3
    with pytest.raises(ValueError, match="input_ids: 2 ids for 1 new tokens"):
        b.stage(batch([seq(2, 1, [5], 2)], 1), input_ids=np.array([3, 4]))
    # An unchanged table is not range-checked again, but a changed one is.
    with pytest.raises(ValueError, match="has a block outside"):
        b.build(batch([seq(2, 1, [5, 10], 2)], 1))


def test_a_table_grown_in_place_is_written_and_checked_only_in_its_tail():
    b = builder()
    table = [5]
    b.build(batch([seq(3, 1, table, 2)], 1))
    table.append(10)
    with pytest.raises(ValueError, match="has a block outside"):
        b.build(batch([seq(4, 1, table, 2)], 1))
    # The same list is trusted to have grown by appending only: its head is not read again.
    table[0], table[1] = 7, 6
    meta = b.build(batch([seq(4, 1, table, 2)], 1))
    assert meta.mla.decode_block_tables.tolist() == [[5, 6, 0]]
    # A shorter list, even the same one, rewrites the row and clears its old tail.
    table.pop()
    meta = b.build(batch([seq(3, 1, table, 2)], 1))
    assert meta.mla.decode_block_tables.tolist() == [[7, 0, 0]]
    # Another list is compared by value: a changed head rewrites the row.
    meta = b.build(batch([seq(4, 1, [8, 6], 2)], 1))
    assert meta.mla.decode_block_tables.tolist() == [[8, 6, 0]]


@pytest.mark.parametrize("seed", range(4))
def test_incremental_rows_equal_a_fresh_builders(seed):
    """One builder fed a random run of steps (tables grown in place, sequences finishing, new
    and preempted ones prefilling from zero on new lists, rows moving, copied tables, padded
    decode steps, some with a dummy prompt) holds after each step what a fresh builder writes for
    that step alone."""
    rng = random.Random(seed)
    sizes = dict(max_num_seqs=6, max_blocks_per_seq=5, num_blocks=40, num_kda_slots=7)
    b, cap = builder(max_num_tokens=32, **sizes), 5 * BLOCK
    free_blocks, free_slots = list(range(1, 40)), list(range(1, 7))
    rng.shuffle(free_blocks)
    seqs: list[list] = []  # [block table, num_computed, kda slot]
    for _ in range(300):
        for s in list(seqs):
            if rng.random() < 0.1 or s[1] + 4 > cap:  # finished
                seqs.remove(s)
                free_blocks += s[0]
                free_slots.append(s[2])
            elif rng.random() < 0.05:  # preempted: re-prefills on a new table
                free_blocks += s[0]
                s[0], s[1] = [], 0
            elif rng.random() < 0.1:
                s[0] = list(s[0])  # an equal copy (what a TP worker may hold)
        if len(seqs) < 6 and rng.random() < 0.4:
            seqs.append([[], 0, free_slots.pop()])
        if rng.random() < 0.2:
            rng.shuffle(seqs)
        seqs.sort(key=lambda s: s[1] == 0)  # decodes first
        new = [1 if s[1] else rng.randint(1, 4) for s in seqs]
        for s, w in zip(seqs, new, strict=True):
            while len(s[0]) * BLOCK < s[1] + w:
                s[0].append(free_blocks.pop())  # in place, as the KV cache manager grows them
        nd = sum(1 for s in seqs if s[1])
        step = BatchSchedule(
            [s[1] for s in seqs], new, [s[0] for s in seqs], [s[2] for s in seqs], nd
        )
        pad_to = rng.randint(len(seqs), 6) if nd == len(seqs) and rng.random() < 0.5 else None
        prompt = rng.randint(0, BLOCK) if pad_to is not None and pad_to < 6 else 0
        fresh = builder(max_num_tokens=32, **sizes)
        t = b.stage(step, pad_to, dummy_prompt=prompt)
        assert fresh.stage(step, pad_to, dummy_prompt=prompt) == t
        n = (len(seqs) if pad_to is None else pad_to) + (prompt > 0)
        for name in ("block_tables", "seq_lens", "kda_slots", "has_initial_state"):
            assert getattr(b, name)[:n].tolist() == getattr(fresh, name)[:n].tolist(), name
        assert b.slot_mapping[:t].tolist() == fresh.slot_mapping[:t].tolist()
        assert b.query_start_loc[: n + 1].tolist() == fresh.query_start_loc[: n + 1].tolist()
        p = n - (nd if pad_to is None else pad_to) + 1  # the prefills' (the dummy prompt's too)
        assert b.prefill_query_start_loc[:p].tolist() == fresh.prefill_query_start_loc[:p].tolist()
        for s, w in zip(seqs, new, strict=True):
            s[1] += w


def test_empty_schedule_builds():
    meta = builder().build(batch([], 0))
    assert meta.num_tokens == 0 and meta.kda.query_start_loc.tolist() == [0]
    assert meta.mla.slot_mapping.numel() == 0 and meta.mla.prefills == []
    # what a runner captures a CUDA graph on: only padded rows
    meta = builder().build(batch([], 0), pad_to=3)
    assert meta.num_tokens == 3 and meta.kda.state_slots.tolist() == [0, 0, 0]
    assert meta.mla.decode_seq_lens.tolist() == [1, 1, 1]
    assert meta.mla.slot_mapping.tolist() == [0, 0, 0]


def test_dummy_prompt_follows_the_padded_rows_on_the_dummies():
    b = builder()
    first = batch([seq(5, 1, [7, 2], 3), seq(2, 1, [4], 1), seq(0, 3, [6], 2)], 2)
    b.build(first)
    meta = b.build(batch([seq(5, 1, [7, 2], 3)], 1), pad_to=2, dummy_prompt=3)
    kda, mla = meta.kda, meta.mla
    assert meta.num_tokens == 5
    assert kda.query_start_loc.tolist() == [0, 1, 2, 5]
    assert kda.state_slots.tolist() == [3, 0, 0]
    assert kda.has_initial_state.tolist() == [True, True, False]  # the prompt: from zero
    assert (kda.num_decodes, kda.num_prefills, mla.num_decodes) == (2, 1, 2)
    assert kda.prefill_query_start_loc.tolist() == [0, 3]
    assert mla.slot_mapping.tolist() == [9, 0, 0, 1, 2]  # block 0, offsets 0..2
    assert mla.decode_block_tables.tolist() == [[7, 2, 0], [0, 0, 0]]
    assert mla.decode_seq_lens.tolist() == [6, 1]
    assert b.block_tables[2].tolist() == [0, 0, 0]  # the real row there was emptied
    ((start, end, slots),) = mla.prefills
    assert (start, end, slots.tolist()) == (2, 5, [0, 1, 2])
    # The rows the dummies emptied are written again by the next real step.
    meta = b.build(first)
    assert meta.mla.decode_block_tables.tolist() == [[7, 2, 0], [4, 0, 0]]
    assert b.block_tables[2].tolist() == [6, 0, 0]


def test_dummy_prompt_is_refused_where_it_does_not_fit():
    b = builder()  # 4 sequences, 16 tokens, blocks of 4
    with pytest.raises(ValueError, match="dummy_prompt must be in \\[0, 4\\] \\(one block\\)"):
        b.build(batch([], 0), pad_to=1, dummy_prompt=5)
    with pytest.raises(ValueError, match="dummy_prompt must be in .* 0 without"):
        b.build(batch([DECODE], 1), dummy_prompt=1)
    with pytest.raises(ValueError, match="pad_to must be in \\[0, 3\\], got 4"):
        b.build(batch([], 0), pad_to=4, dummy_prompt=1)  # no row left for the prompt
    with pytest.raises(ValueError, match="batch: 5 tokens exceed max_num_tokens 4"):
        builder(max_num_tokens=4).build(batch([], 0), pad_to=3, dummy_prompt=2)


# ---------------------------------------------------------------------------------------------
# The model through the seam
# ---------------------------------------------------------------------------------------------


def test_cache_spec_bytes_equal_the_allocated_caches(model):
    spec = model.get_kv_cache_spec()
    layers = model.layers
    assert [isinstance(spec[i], KDAStateSpec) for i in range(3)] == [x.is_kda for x in layers]
    kda_spec = spec[0]
    assert kda_spec.conv_shape == (3 * 2 * 32, 3)  # short_conv_kernel_size 4 of the config
    assert (kda_spec.conv_dtype, kda_spec.ssm_dtype) == (torch.float32, torch.float32)
    assert spec[1] == MLAAttentionSpec(entry_size=32 + 8, dtype=torch.float32)
    pools, caches = allocate_kv_caches(spec, 7, BLOCK, 5, "cpu")
    for i, pool in pools.items():
        assert pool.conv_state.nbytes + pool.ssm_state.nbytes == 5 * spec[i].bytes_per_slot
    for i, cache in caches.items():
        assert cache.nbytes == 7 * spec[i].bytes_per_block(BLOCK)
        assert spec[i].bytes_per_block(BLOCK) == BLOCK * spec[i].bytes_per_token
    model.bind_kv_caches(pools, caches)
    assert layers[0].self_attn.state_pool is pools[0]
    assert layers[1].self_attn.kv_cache is caches[1]


def test_bind_kv_caches_checks_them_against_the_spec(model):
    spec = model.get_kv_cache_spec()
    pools, caches = allocate_kv_caches(spec, 7, BLOCK, 5, "cpu")
    with pytest.raises(ValueError, match="kda_pools has layers \\[0\\], the model \\[0, 2\\]"):
        model.bind_kv_caches({0: pools[0]}, caches)
    with pytest.raises(ValueError, match="mla_caches has layers"):
        model.bind_kv_caches(pools, {})
    with pytest.raises(ValueError, match="mla_caches\\[1\\]: torch.bfloat16"):
        model.bind_kv_caches(pools, {1: caches[1].bfloat16()})
    with pytest.raises(ValueError, match="kv_cache of .*: shape \\(7, 4, 39\\)"):
        model.bind_kv_caches(pools, {1: caches[1][..., :39]})
    small = dict(pools)
    small[2] = type(pools[2])(pools[2].conv_state[:, :, :2], pools[2].ssm_state)
    with pytest.raises(ValueError, match="pool of .*layers.2.*conv"):
        model.bind_kv_caches(small, caches)
    model.bind_kv_caches(pools, caches)
    model.bind_kv_caches({}, {})  # released, e.g. after a profiling run
    assert all(getattr(x.self_attn, "state_pool", None) is None for x in model.layers)
    assert model.layers[1].self_attn.kv_cache is None
    meta = EngineHarness(model).schedule({0: 2})
    model.bind_kv_caches({}, {})
    with pytest.raises(RuntimeError, match="no state pool bound"):
        model(torch.tensor([5, 6]), meta)


def test_empty_batch_returns_an_empty_result(model):
    harness = EngineHarness(model)
    meta = harness.schedule({})
    with torch.no_grad():
        hidden = model(torch.empty(0, dtype=torch.long), meta)
    assert hidden.shape == (0, 64)
    assert harness.step({}).shape == (0, 128)


def test_padded_decode_changes_no_real_row_slot_or_block(model):
    padded, plain = EngineHarness(model), EngineHarness(model)
    prompts = {0: [5, 6, 7, 8, 9], 1: [10, 11], 2: [12, 13, 14]}
    for harness in (padded, plain):
        model.bind_kv_caches(harness.kda_pools, harness.mla_caches)
        harness.step(prompts)
    # sequence 2 sits out the decode step: its slot and blocks must not move
    model.bind_kv_caches(padded.kda_pools, padded.mla_caches)
    before = {i: (p.conv_state.clone(), p.ssm_state.clone()) for i, p in padded.kda_pools.items()}
    caches_before = {i: c.clone() for i, c in padded.mla_caches.items()}
    got = padded.step({0: [20], 1: [21]}, pad_to=6)
    assert got.shape[0] == 6
    model.bind_kv_caches(plain.kda_pools, plain.mla_caches)
    expected = plain.step({0: [20], 1: [21]})
    # fp32; the two batches differ only in their row count, by which the CPU BLAS may round a
    # row's product differently (ulps, seen): far under 1e-5.
    torch.testing.assert_close(got[:2], expected, rtol=1e-5, atol=1e-5)
    idle_slot, idle_blocks = padded.slots[2], padded.tables[2]
    for i, pool in padded.kda_pools.items():
        assert torch.equal(pool.conv_state[idle_slot], before[i][0][idle_slot])
        assert torch.equal(pool.ssm_state[idle_slot], before[i][1][idle_slot])
        for real in (padded.slots[0], padded.slots[1]):
            torch.testing.assert_close(pool.ssm_state[real], plain.kda_pools[i].ssm_state[real])
        untouched = torch.ones(pool.num_slots, dtype=torch.bool)
        untouched[[0, padded.slots[0], padded.slots[1]]] = False
        assert torch.equal(pool.ssm_state[untouched], before[i][1][untouched])
    for i, cache in padded.mla_caches.items():
        assert torch.equal(cache[idle_blocks], caches_before[i][idle_blocks])
        # the only writes: the two real tokens and the dummy block 0
        changed = (cache != caches_before[i]).any(-1).nonzero().tolist()
        allowed = {(padded.tables[s][4 // BLOCK if s == 0 else 0], (5 if s == 0 else 2) % BLOCK)
                   for s in (0, 1)}  # fmt: skip
        assert {tuple(c) for c in changed if c[0] != 0} <= allowed
        assert not torch.equal(cache[0], caches_before[i][0])  # padded rows wrote the dummy


def test_new_one_token_prompt_on_a_reused_slot_starts_from_zero(model):
    """The slot and blocks of a finished sequence go to a new one-token prompt: it must not read
    the previous owner's state, whether it runs next to a decode (mixed batch) or alone, and its
    following decode-only (fused path) step must continue from its own state only."""
    fresh = EngineHarness(model)
    lone = fresh.step({7: [33]})
    lone_next = fresh.step({7: [34]})
    for mixed in (True, False):
        reused = EngineHarness(model)
        reused.step({0: [5, 6, 7, 8, 9], 1: [10, 11, 12]})
        reused.step({0: [13], 1: [14]})
        old_slot = reused.slots[1]
        reused.free(1)
        assert reused.kda_pools[0].ssm_state[old_slot].abs().sum() > 0  # a stale state is there
        with pytest.raises(ValueError, match="is a decode"):  # never a decode (fused) row
            reused.builder.build(BatchSchedule([0], [1], [[reused.free_blocks[-1]]], [old_slot], 1))
        batch = {0: [15], 7: [33]} if mixed else {7: [33]}
        got = reused.step(batch)[-1:]
        assert reused.slots[7] == old_slot
        torch.testing.assert_close(got, lone, rtol=1e-5, atol=1e-5)
        following = reused.step({0: [16], 7: [34]})  # decode-only: the fused decode path
        torch.testing.assert_close(following[1:], lone_next, rtol=1e-5, atol=1e-5)


def test_conv_width_3_model_matches_transformers(hf_kimi_linear, tmp_path):
    """The KDA pools take the conv window from the model's `short_conv_kernel_size`."""
    linear_attn = dict(TINY["linear_attn_config"], short_conv_kernel_size=3)
    hf = random_hf_model(hf_kimi_linear, linear_attn_config=linear_attn)
    hf.save_pretrained(tmp_path)
    model = load_ours(tmp_path)
    assert model.get_kv_cache_spec()[0].conv_shape == (3 * 2 * 32, 2)
    prompt, decoded = [5, 6, 7, 8, 9, 10, 11], [12, 13]
    with torch.no_grad():
        expected = hf(torch.tensor([prompt + decoded])).logits[0]
    harness = EngineHarness(model)
    got = torch.cat([harness.step({0: prompt})] + [harness.step({0: [t]}) for t in decoded])
    # fp32 both; chunked (transformers) vs recurrent (ours) summation order: as in
    # test_amd_model's parity test, relative error well under 1e-4.
    assert float((got - expected).norm() / expected.norm()) < 1e-4
