"""The split-KV Triton MLA decode kernel (under TRITON_INTERPRET=1 on CPU) against the torch
reference: paged caches whose unused rows are NaN, lengths at and around block boundaries, one and
several splits (some past a sequence's end), padded head and column tiles; the splits merged in a
second launch and in the split launch (the same bits, the arrival counters back at 0); the latent
in column chunks; the default launch choice; validation; and on a GPU, Kimi-Linear sizes and
CUDA-graph replay."""

import math
from collections import Counter
from dataclasses import replace

import pytest
import torch
from counted_kernels import record_launches

import vllm.models.kimi_k3.amd.ops.mla_decode as op_module
from vllm.config.vllm import decode_batch_class
from vllm.models.kimi_k3.amd.ops.mla_decode import (
    launch_mla_decode,
    mla_decode_paged,
    mla_decode_paged_ref,
)
from vllm.models.kimi_k3.amd.ops.mla_decode_config import (
    DECODE_COUNTERS,
    MlaDecodeConfig,
    merge_block_l,
    mla_decode_config,
)
from vllm.triton_utils import num_sms

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.fixture
def launches(monkeypatch):
    """Counts launches of the two kernels, so a test cannot pass on the torch reference alone."""
    counts = Counter()

    class Counted:
        def __init__(self, name, kernel):
            self.name, self.kernel = name, kernel

        def __getitem__(self, grid):
            def launch(*args, **kwargs):
                counts[self.name] += 1
                return self.kernel[grid](*args, **kwargs)

            return launch

    for name in ("_mla_decode_split_kernel", "_mla_decode_merge_kernel"):
        monkeypatch.setattr(op_module, name, Counted(name, getattr(op_module, name)))
    return counts


_REAL_EMPTY = torch.empty


def nan_empty(*args, **kwargs):
    """`torch.empty` whose floating-point buffers start as NaN."""
    t = _REAL_EMPTY(*args, **kwargs)
    return t.fill_(float("nan")) if t.is_floating_point() else t


def make_case(n, heads, latent, rope, block_size, seq_lens, max_blocks, dtype, seed):
    """Queries (strided views of one [N, H, L + R] tensor), a paged cache with the sequences'
    blocks scattered among spare ones, and the same cache with every row no sequence may read
    (tails of last blocks, padded table entries, spare blocks) set to NaN."""
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(n, heads, latent + rope, generator=gen).to(dtype)
    num_blocks = n * max_blocks + 3
    cache = torch.randn(num_blocks, block_size, latent + rope, generator=gen).to(dtype)
    block_tables = torch.randperm(num_blocks, generator=gen)[: n * max_blocks].view(n, max_blocks)
    readable = torch.zeros(num_blocks, block_size, dtype=torch.bool)
    for i, length in enumerate(seq_lens):
        for p in range(length):
            readable[block_tables[i, p // block_size], p % block_size] = True
    # The reference multiplies zero probabilities into unread rows, so it gets zeros there; the
    # kernel gets NaN, which would show in its output if it read any of them.
    clean = cache.masked_fill(~readable[..., None], 0.0)
    poisoned = cache.masked_fill(~readable[..., None], float("nan"))
    index_dtype = torch.int32 if n % 2 else torch.int64
    return (
        dict(
            q_latent=q[..., :latent].to(DEVICE),
            q_pe=q[..., latent:].to(DEVICE),
            block_tables=block_tables.to(index_dtype).to(DEVICE),
            seq_lens=torch.tensor(seq_lens, dtype=index_dtype, device=DEVICE),
            scale=(latent + rope) ** -0.5,
        ),
        clean.to(DEVICE),
        poisoned.to(DEVICE),
    )


def tolerance(dtype):
    # fp32: IEEE fp32 products in both; only the summation order and exp2 vs exp differ (a few
    # ulps over <= 64 terms). bf16: the kernel rounds each probability to bf16 for the p @ c
    # product (relative <= 2^-8 even when the interpreter truncates), which perturbs the
    # weighted mean of c (|c| <~ 4) by far less than 2^-8 * 4 on average, and both outputs are
    # rounded to bf16 at the end (2^-9 relative each).
    return (1e-5, 1e-5) if dtype == torch.float32 else (2**-7, 2**-7)


def check(got, ref, dtype):
    assert got.shape == ref.shape and got.dtype == dtype
    assert torch.isfinite(got).all()
    rtol, atol = tolerance(dtype)
    torch.testing.assert_close(got.float(), ref.float(), rtol=rtol, atol=atol)


def counters_for(device=DEVICE):
    return torch.zeros(DECODE_COUNTERS, dtype=torch.int32, device=device)


def same_bits(a, b):
    """Equal bit for bit (`torch.equal` takes -0 for +0)."""
    return (
        a.dtype == b.dtype
        and a.shape == b.shape
        and torch.equal(a.contiguous().view(torch.uint8), b.contiguous().view(torch.uint8))
    )


def both_merges(args, kv_cache, config, counters):
    """The output merged in a second launch and in the split launch, checked equal bit for bit
    (the same sums in the same order), with every arrival counter back at 0."""
    two = launch_mla_decode(kv_cache=kv_cache, config=replace(config, fused_merge=False), **args)
    one = launch_mla_decode(
        kv_cache=kv_cache, config=replace(config, fused_merge=True), counters=counters, **args
    )
    assert same_bits(one, two)
    assert not counters.any()
    return one


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("block_size", [4, 16])
@pytest.mark.parametrize("latent,rope", [(32, 8), (64, 16)])
@pytest.mark.parametrize("heads", [1, 4])
@pytest.mark.parametrize("n", [1, 3])
def test_triton_matches_reference(n, heads, latent, rope, block_size, dtype, launches):
    # Lengths: one token, exactly one block, one past a block; the table has a padded block.
    lengths = [2 * block_size + 1] if n == 1 else [1, block_size, 2 * block_size + 1]
    args, clean, poisoned = make_case(
        n, heads, latent, rope, block_size, lengths, 4, dtype, seed=n * heads + latent + block_size
    )
    ref = mla_decode_paged_ref(kv_cache=clean, **args)
    # Three splits: with one token the second and third are empty (the first writes the output);
    # with 2 * block_size + 1 tokens and 16-token tiles, the last split is empty for block_size 4.
    config = MlaDecodeConfig(num_splits=1, block_h=16, block_n=16, num_warps=4, num_stages=1)
    check(launch_mla_decode(kv_cache=poisoned, config=config, **args), ref, dtype)
    config = replace(config, num_splits=3)
    check(both_merges(args, poisoned, config, counters_for()), ref, dtype)
    assert launches == {"_mla_decode_split_kernel": 3, "_mla_decode_merge_kernel": 1}


@pytest.mark.parametrize("latent_chunks", [2, 4])
@pytest.mark.parametrize(
    "dtype,latent,rope,heads,block_n",
    [(torch.float32, 64, 16, 4, 16), (torch.bfloat16, 48, 8, 20, 32),
     (torch.bfloat16, 512, 64, 2, 16)],
    ids=["fp32_L64", "bf16_L48", "bf16_L512"],
)  # fmt: skip
def test_latent_chunks_match_reference(latent_chunks, dtype, latent, rope, heads, block_n,
                                       launches):  # fmt: skip
    """The latent in 2 or 4 column chunks, one split and three merged both ways: full chunks,
    a padded latent (48 of 64 columns: the last of 4 chunks all padding, the last of 2 partly),
    two head blocks with padded heads, and Kimi-Linear's widths."""
    args, clean, poisoned = make_case(3, heads, latent, rope, 8, [1, 8, 41], 6, dtype,
                                      seed=latent + latent_chunks)  # fmt: skip
    ref = mla_decode_paged_ref(kv_cache=clean, **args)
    config = MlaDecodeConfig(num_splits=1, block_h=16, block_n=block_n, num_warps=4, num_stages=1,
                             latent_chunks=latent_chunks)  # fmt: skip
    check(launch_mla_decode(kv_cache=poisoned, config=config, **args), ref, dtype)
    config = replace(config, num_splits=3)
    check(both_merges(args, poisoned, config, counters_for()), ref, dtype)
    assert launches == {"_mla_decode_split_kernel": 3, "_mla_decode_merge_kernel": 1}


@pytest.mark.parametrize("latent_chunks", [1, 2, 4])
def test_config_passes_latent_chunks(latent_chunks, monkeypatch):
    """`latent_chunks` reaches the split kernel (the tests above would pass with any count);
    the default launch takes one chunk."""
    launched = record_launches(monkeypatch, op_module, "_mla_decode_split_kernel")
    args, clean, _ = make_case(1, 4, 64, 8, 4, [9], 3, torch.float32, seed=1)
    config = MlaDecodeConfig(2, 16, 16, 4, 1, latent_chunks=latent_chunks)
    check(launch_mla_decode(kv_cache=clean, config=config, **args),
          mla_decode_paged_ref(kv_cache=clean, **args), torch.float32)  # fmt: skip
    mla_decode_paged(kv_cache=clean, **args)
    assert [kw["LATENT_CHUNKS"] for kw in launched] == [latent_chunks, 1]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_kimi_widths_short_context(dtype, launches):
    """L = 512, R = 64 (Kimi-Linear's widths), through the entry point and the default config."""
    args, clean, poisoned = make_case(2, 2, 512, 64, 16, [5, 16], 2, dtype, seed=7)
    got = mla_decode_paged(kv_cache=poisoned, **args)
    check(got, mla_decode_paged_ref(kv_cache=clean, **args), dtype)
    assert launches == {"_mla_decode_split_kernel": 1}


def test_many_tiles_and_splits(launches):
    """Several tiles per split, splits not dividing the tiles, and more than 16 heads (two head
    blocks), so the online softmax rescales across tiles and the merge weighs uneven splits."""
    args, clean, poisoned = make_case(2, 20, 32, 8, 8, [97, 200], 25, torch.float32, seed=3)
    ref = mla_decode_paged_ref(kv_cache=clean, **args)
    config = MlaDecodeConfig(num_splits=5, block_h=16, block_n=16, num_warps=4, num_stages=1)
    check(both_merges(args, poisoned, config, counters_for()), ref, torch.float32)
    assert launches == {"_mla_decode_split_kernel": 2, "_mla_decode_merge_kernel": 1}


@pytest.mark.parametrize("heads,block_h,block_n", [(20, 32, 32), (20, 16, 16), (3, 16, 64)])
def test_many_splits_and_column_chunks(heads, block_h, block_n, launches, monkeypatch):
    """40 splits: 39 of them active for 613 tokens in 16-token tiles (three steps of the
    one-launch merge, the last split partly filled), 20 or 10 in wider tiles; one token leaves
    one active split, which writes the output itself. One head block with padded heads, or two;
    merge programs over column chunks. The partial buffer starts as NaN: no merge may use an
    inactive split's rows (the two-launch merge reads them and must discard them)."""
    args, clean, poisoned = make_case(2, heads, 128, 16, 8, [1, 613], 80, torch.float32, seed=4)
    ref = mla_decode_paged_ref(kv_cache=clean, **args)
    config = MlaDecodeConfig(num_splits=40, block_h=block_h, block_n=block_n, num_warps=4,
                             num_stages=5)  # fmt: skip
    counters = counters_for()
    monkeypatch.setattr(torch, "empty", nan_empty)
    got = both_merges(args, poisoned, config, counters)
    monkeypatch.undo()
    check(got, ref, torch.float32)
    assert launches == {"_mla_decode_split_kernel": 2, "_mla_decode_merge_kernel": 1}


@pytest.mark.parametrize("scores", ["mixed", "negative"])
def test_splits_past_the_merge_unrolled_ones(scores, launches, monkeypatch):
    """More splits than the two-launch merge unrolls: 1100 tokens in 16-token tiles leave 69 of
    80 splits active, so its loop over the active splits past the unrolled ones runs (three of
    them in a partly filled chunk); 500 tokens leave 32 active, all unrolled. Partials start as
    NaN: no merge may use an inactive split's rows. With every score negative, so is every
    log-sum-exp: the merge's floor under its maximum must not bind."""
    assert 32 < op_module._MERGE_UNROLLED_SPLITS < 69
    args, clean, poisoned = make_case(2, 3, 32, 8, 16, [1100, 500], 80, torch.float32, seed=6)
    if scores == "negative":
        args = dict(args, q_latent=-4 * args["q_latent"].abs(), q_pe=-4 * args["q_pe"].abs())
        clean, poisoned = clean.abs(), poisoned.abs()
    ref = mla_decode_paged_ref(kv_cache=clean, **args)
    config = MlaDecodeConfig(num_splits=80, block_h=16, block_n=16, num_warps=4, num_stages=1)
    monkeypatch.setattr(torch, "empty", nan_empty)
    got = both_merges(args, poisoned, config, counters_for())
    monkeypatch.undo()
    check(got, ref, torch.float32)
    assert launches == {"_mla_decode_split_kernel": 2, "_mla_decode_merge_kernel": 1}


def test_default_config_depends_on_shapes_only():
    sms = 132
    # Wide latents on CUDA: 64-token tiles, 8 warps, 5 stages (double-buffered), 1 per SM, the
    # latent in 4 chunks; one sequence in 16-head blocks (66 programs of each, a wave), more in
    # 32-head blocks.
    config = mla_decode_config(1, 32, 512, 32768, sms)
    assert config == MlaDecodeConfig(num_splits=66, block_h=16, block_n=64, num_warps=8,
                                     num_stages=5, latent_chunks=4)  # fmt: skip
    assert mla_decode_config(2, 32, 512, 32768, sms).block_h == 32
    # Splits fill one wave of 132 programs, rounded down; at most 128; >= 128 tokens each past
    # the one-tile splits.
    assert mla_decode_config(4, 32, 512, 32768, sms).num_splits == 33
    assert mla_decode_config(8, 32, 512, 32768, sms).num_splits == 16
    assert mla_decode_config(64, 32, 512, 32768, sms).num_splits == 2
    assert mla_decode_config(1, 32, 512, 8192, sms).num_splits == 64
    # Short capacities: one-tile splits (the last tile partial), up to 33 of them for one
    # sequence, 16 (one merge chunk) for more (the next test).
    assert mla_decode_config(1, 32, 512, 200, sms).num_splits == 4
    assert mla_decode_config(1, 32, 512, 1066, sms).num_splits == 17
    assert mla_decode_config(2, 32, 512, 1066, sms).num_splits == 16
    # The capacity's tiles rounded up: 200 tokens are 4 tiles, for several sequences too.
    assert mla_decode_config(2, 32, 512, 200, sms).num_splits == 4
    assert mla_decode_config(1, 32, 512, 63, sms).num_splits == 1
    # A full wave of (sequence, head block) programs: no split, no merge kernel.
    assert mla_decode_config(132, 32, 512, 32768, sms).num_splits == 1
    assert mla_decode_config(64, 128, 512, 32768, sms).num_splits == 1
    config = mla_decode_config(1, 4, 32, 64, 1)
    assert config.block_h == 16 and config.block_n >= 16 and config.num_splits == 1
    # Less shared memory than two [64, 576] tiles need (A100; fp32 caches on an H200):
    # single-buffered 32-token tiles.
    # single-buffered 32-token tiles, one latent chunk (the chunks were measured on the wide
    # tiles only).
    small = mla_decode_config(1, 32, 512, 32768, 108, max_smem=164 * 1024)
    assert (small.block_n, small.num_stages, small.latent_chunks) == (32, 2, 1)
    fp32 = mla_decode_config(1, 32, 512, 32768, 132, max_smem=227 * 1024, elem_bytes=4)
    assert (fp32.block_n, fp32.num_stages, fp32.latent_chunks) == (32, 2, 1)
    bf16 = mla_decode_config(1, 32, 512, 32768, 132, max_smem=227 * 1024, elem_bytes=2)
    assert (bf16.block_n, bf16.num_stages, bf16.latent_chunks) == (64, 5, 4)
    assert mla_decode_config(1, 4, 32, 64, 1).latent_chunks == 1  # narrow latents


def test_default_launch_is_the_batch_class_launch():
    # An eager decode of n sequences (a mixed step's decode rows) takes the launch of the graph
    # its class would replay, compiled at capture: a launch of its own (the splits of 132 // n,
    # a new SPLITS constexpr for the merge) cost a Triton compile of ~0.3 s in the step (H100,
    # docs/performance.md, "Thirty-fifth run").
    for capacity in (1066, 8224, 32800):
        for n in range(1, 600):
            c = decode_batch_class(n)
            for sms, smem in ((132, 227 * 1024), (108, 164 * 1024)):
                assert mla_decode_config(n, 32, 512, capacity, sms, smem, counters=1024) == (
                    mla_decode_config(c, 32, 512, capacity, sms, smem, counters=1024)
                ), (capacity, n)
                assert merge_block_l(n, 32, 512, sms) == merge_block_l(c, 32, 512, sms)


def test_default_merge_form_and_short_context_splits(monkeypatch):
    # The one-launch merge takes one latent chunk: the tiles of a device with less shared
    # memory than the pipelined wide ones need (an H100 PCIe-like 132 SMs with 164 KiB).
    def pick(n, capacity, counters=DECODE_COUNTERS, max_smem=164 * 1024):
        config = mla_decode_config(n, 32, 512, capacity, 132, max_smem, counters=counters)
        return config.num_splits, config.fused_merge

    # The pipelined wide tiles (latent in 4 chunks) always merge in a second launch.
    assert pick(64, 32768, max_smem=227 * 1024) == (2, False)
    assert pick(1, 256, max_smem=227 * 1024) == (4, False)
    # The merging program reads num_splits * block_h heads * 512 * 4 B: up to 128 KiB (2 splits
    # of 32 heads, 4 of 16) merge in the split launch, more in a second launch.
    assert pick(1, 32768) == (66, False)  # 16-head blocks for one sequence
    assert pick(8, 32768) == (16, False)
    assert pick(16, 32768) == (8, False)
    assert pick(64, 32768) == (2, True)
    assert pick(132, 32768) == (1, False)  # nothing to merge
    # Without a counter for every (sequence, head block): two launches.
    assert pick(64, 32768, counters=0) == (2, False)
    assert pick(64, 32768, counters=63) == (2, False)
    assert pick(1, 128) == (4, True)  # 4 one-tile splits of 16 heads: 128 KiB
    assert pick(1, 256) == (8, False)
    # Short capacities: splits of one tile (64 tokens here), up to 33 of them for one sequence
    # and 16 for more ...
    wide = 227 * 1024
    assert pick(1, 256, max_smem=wide) == (4, False)
    assert pick(1, 1024, max_smem=wide) == (16, False)
    assert pick(4, 1024, max_smem=wide) == (16, False)
    assert pick(16, 1024, max_smem=wide) == (8, False)
    assert pick(1, 2048, max_smem=wide) == (32, False)
    assert pick(1, 2096, max_smem=wide) == (33, False)
    assert pick(1, 4096, max_smem=wide) == (33, False)
    # ... beyond that no split shorter than 128 tokens of capacity.
    assert pick(4, 2096, max_smem=wide) == (16, False)
    assert pick(2, 4096, max_smem=wide) == (32, False)
    assert pick(1, 8192, max_smem=wide) == (64, False)
    # ROCm: the ordering argument is PTX's, so always two launches.
    monkeypatch.setattr(op_module.current_platform, "is_rocm", lambda: True)
    assert pick(64, 32768) == (2, False)


def test_entry_point_merges_in_one_launch_with_counters(launches, monkeypatch):
    """The default launch with the H200's SM count (the CPU has one): three one-tile splits of
    a 192-token capacity (active: 3, 1 and 2), merged in the split launch when the caller passes
    counters, in a second launch without; the same bits."""
    monkeypatch.setattr(op_module, "num_sms", lambda device=None: 132)
    args, clean, poisoned = make_case(3, 4, 32, 8, 16, [150, 1, 100], 12, torch.float32, seed=5)
    counters = counters_for()
    one = mla_decode_paged(kv_cache=poisoned, counters=counters, **args)
    assert launches == {"_mla_decode_split_kernel": 1}
    two = mla_decode_paged(kv_cache=poisoned, **args)
    assert launches == {"_mla_decode_split_kernel": 2, "_mla_decode_merge_kernel": 1}
    assert same_bits(one, two) and not counters.any()
    check(one, mla_decode_paged_ref(kv_cache=clean, **args), torch.float32)


def test_entry_point_one_sequence_past_one_merge_chunk(launches, monkeypatch):
    """The default launch of one 1050-token sequence in a 1072-token table: 17 one-tile splits,
    one more than a merge chunk, so both merges take a second step; against the reference."""
    monkeypatch.setattr(op_module, "num_sms", lambda device=None: 132)
    args, clean, poisoned = make_case(1, 4, 32, 8, 16, [1050], 67, torch.float32, seed=11)
    config = mla_decode_config(1, 4, 32, 67 * 16, 132, counters=DECODE_COUNTERS)
    assert (config.num_splits, config.block_n, config.fused_merge) == (17, 64, True)
    one = mla_decode_paged(kv_cache=poisoned, counters=counters_for(), **args)
    two = mla_decode_paged(kv_cache=poisoned, **args)
    assert launches == {"_mla_decode_split_kernel": 2, "_mla_decode_merge_kernel": 1}
    assert same_bits(one, two)
    check(one, mla_decode_paged_ref(kv_cache=clean, **args), torch.float32)


def test_counters_serve_launch_after_launch(launches):
    """One counters tensor through launches of other batch sizes, lengths and head blocks: each
    leaves every counter at 0, or a later launch would merge too early or never."""
    counters = counters_for()
    cases = [(2, 20, [97, 200]), (3, 4, [1, 64, 33]), (1, 20, [200])]
    for seed, (n, heads, lengths) in enumerate(cases):
        args, clean, poisoned = make_case(n, heads, 32, 8, 8, lengths, 25, torch.float32, seed)
        config = MlaDecodeConfig(6, 16, 16, 4, 1, fused_merge=True)
        got = launch_mla_decode(kv_cache=poisoned, config=config, counters=counters, **args)
        check(got, mla_decode_paged_ref(kv_cache=clean, **args), torch.float32)
        assert not counters.any()
    assert launches == {"_mla_decode_split_kernel": 3}


def test_one_launch_merge_checks_its_counters():
    args, clean, _ = make_case(2, 20, 32, 8, 8, [97, 200], 25, torch.float32, seed=3)
    config = MlaDecodeConfig(5, 16, 16, 4, 1, fused_merge=True)
    slots = torch.zeros(8, dtype=torch.int32)
    for counters, match in (
        (None, "needs a counters tensor"),
        (slots[:3], "holds 3 slots, the launch needs 4"),
        (slots.long(), "int32"),
        (slots[::2], "contiguous 1-D"),
        (slots.to("meta"), "on q_latent's device"),
    ):
        with pytest.raises(ValueError, match=match):
            launch_mla_decode(kv_cache=clean, config=config, counters=counters, **args)
    # One split merges nothing: no counters needed.
    launch_mla_decode(kv_cache=clean, config=replace(config, num_splits=1), **args)


def test_config_is_checked():
    args, clean, _ = make_case(1, 1, 32, 8, 4, [3], 1, torch.float32, seed=0)
    for bad, match in (
        (MlaDecodeConfig(0, 16, 16, 4, 1), "num_splits"),
        (MlaDecodeConfig(1, 8, 16, 4, 1), "block_h"),
        (MlaDecodeConfig(1, 16, 24, 4, 1), "block_n"),
        (MlaDecodeConfig(1, 16, 16, 4, 1, latent_chunks=3), "latent_chunks must be 1, 2 or 4"),
        (MlaDecodeConfig(1, 16, 16, 4, 1, latent_chunks=0), "latent_chunks must be 1, 2 or 4"),
        # L = 32 in 4 chunks: 8 columns each, under tl.dot's 16.
        (MlaDecodeConfig(1, 16, 16, 4, 1, latent_chunks=4), "of the 32 padded latent columns"),
    ):
        with pytest.raises(ValueError, match=match):
            launch_mla_decode(kv_cache=clean, config=bad, **args)


def test_zero_sequences_launch_nothing(launches):
    args, clean, _ = make_case(1, 2, 32, 8, 4, [3], 1, torch.float32, seed=0)
    args = {k: (v[:0] if isinstance(v, torch.Tensor) else v) for k, v in args.items()}
    out = mla_decode_paged(kv_cache=clean, **args)
    assert out.shape == (0, 2, 32) and not launches


def _bad_inputs():
    args, cache, _ = make_case(2, 2, 32, 8, 4, [3, 4], 2, torch.float32, seed=0)
    base = dict(args, kv_cache=cache)
    yield "q_pe", dict(base, q_pe=base["q_pe"][:1])
    yield "kv_cache", dict(base, kv_cache=cache[..., :-1])
    yield "block_tables", dict(base, block_tables=base["block_tables"][:1])
    yield "block_tables must be int", dict(base, block_tables=base["block_tables"].float())
    yield "seq_lens", dict(base, seq_lens=base["seq_lens"][:1])
    yield "seq_lens must be int", dict(base, seq_lens=base["seq_lens"].float())
    yield (
        "q_latent must be fp16",
        dict(base, q_latent=base["q_latent"].double(), q_pe=base["q_pe"].double()),
    )
    yield "kv_cache must have q_latent's dtype", dict(base, kv_cache=cache.bfloat16())
    yield "q_pe must have q_latent's dtype", dict(base, q_pe=base["q_pe"].half())
    yield (
        "q_latent must have unit stride",
        dict(base, q_latent=base["q_latent"].transpose(1, 2).contiguous().transpose(1, 2)),
    )
    yield (
        "kv_cache must have unit stride",
        dict(base, kv_cache=cache.transpose(1, 2).contiguous().transpose(1, 2)),
    )
    yield "seq_lens must be on q_latent's device", dict(base, seq_lens=base["seq_lens"].to("meta"))
    # The kernels read a table row and seq_lens at unit stride: every other entry of a wider
    # buffer would be read as the next one (silently wrong before the check).
    wide_tables = base["block_tables"].repeat_interleave(2, dim=1)
    yield "block_tables must have unit stride", dict(base, block_tables=wide_tables[:, ::2])
    wide_lens = base["seq_lens"].repeat_interleave(2)
    yield "seq_lens must have unit stride", dict(base, seq_lens=wide_lens[::2])
    yield "counters must be a contiguous 1-D int32", dict(base, counters=torch.zeros(4))


@pytest.mark.parametrize("match,inputs", list(_bad_inputs()), ids=lambda x: str(x)[:30])
def test_validation(match, inputs):
    with pytest.raises(ValueError, match=match):
        mla_decode_paged(**inputs)


# ---------------------------------------------------------------------------------------------
# GPU: Kimi-Linear sizes (H = 32, L = 512, R = 64), batch 1..64, contexts up to 32k
# ---------------------------------------------------------------------------------------------


def make_gpu_case(n, capacity, block_size, dtype, seed):
    """Random lengths up to `capacity` (with a 1 and a full one), blocks scattered in the pool."""
    gen = torch.Generator(device="cuda").manual_seed(seed)
    heads, latent, rope = 32, 512, 64
    max_blocks = capacity // block_size
    lengths = torch.randint(1, capacity + 1, (n,), generator=gen, device="cuda")
    lengths[0] = capacity
    lengths[-1] = 1 if n > 1 else lengths[-1]
    num_blocks = n * max_blocks + 7
    cache = torch.randn(num_blocks, block_size, latent + rope, generator=gen, device="cuda")
    perm = torch.randperm(num_blocks, generator=gen, device="cuda")[: n * max_blocks]
    q = torch.randn(n, heads, latent + rope, generator=gen, device="cuda")
    return dict(
        q_latent=q[..., :latent].to(dtype),
        q_pe=q[..., latent:].to(dtype),
        kv_cache=cache.to(dtype),
        block_tables=perm.view(n, max_blocks).to(torch.int32),
        seq_lens=lengths.to(torch.int32),
        scale=(192) ** -0.5,  # Kimi-Linear's softmax scale: (qk_nope + qk_rope) ** -0.5
    )


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("n,capacity,block_size", [(1, 8192, 64), (8, 4096, 16), (64, 2048, 256),
                                                   (64, 8192, 128), (3, 100 * 16, 16)])  # fmt: skip
def test_gpu_kimi_sizes(n, capacity, block_size, dtype):
    args = make_gpu_case(n, capacity, block_size, dtype, seed=n + capacity)
    got = mla_decode_paged(**args)
    ref = mla_decode_paged_ref(**args)
    # bf16/fp16 probabilities in p @ c: relative 2^-9 (bf16) per weight, rounded to nearest.
    rtol, atol = tolerance(torch.bfloat16)
    torch.testing.assert_close(got.float(), ref.float(), rtol=rtol, atol=atol)


@pytest.mark.gpu
@pytest.mark.parametrize(
    "block_h,block_n,num_warps,num_stages,latent_chunks",
    [(32, 32, 8, 2, 1), (32, 16, 8, 2, 1), (32, 32, 8, 5, 1), (32, 32, 8, 7, 1), (32, 64, 8, 5, 1),
     (32, 64, 8, 2, 1), (16, 32, 8, 5, 1), (16, 16, 8, 5, 1), (16, 64, 8, 5, 1),
     (32, 64, 8, 5, 2), (32, 64, 8, 5, 4), (16, 64, 8, 5, 2), (16, 64, 8, 5, 4)],
)  # fmt: skip
def test_gpu_benchmark_sweep_configs(block_h, block_n, num_warps, num_stages, latent_chunks):
    """Every kernel config benchmark_mla_decode.py sweeps by default, and the wide ones with the
    latent in 2 or 4 chunks, at Kimi-Linear sizes with 7 splits merged both ways (the default's
    and the chunked ones with a single split too): each compiles on the device and matches the
    reference, and the two merges give the same bits."""
    args = make_gpu_case(4, 4096, 64, torch.bfloat16, seed=block_n + num_stages)
    ref = mla_decode_paged_ref(**args)
    rtol, atol = tolerance(torch.bfloat16)
    config = MlaDecodeConfig(7, block_h, block_n, num_warps, num_stages,
                             latent_chunks=latent_chunks)  # fmt: skip
    if latent_chunks > 1 or (block_h, block_n, num_stages) == (32, 64, 5):
        got = launch_mla_decode(**args, config=replace(config, num_splits=1))
        torch.testing.assert_close(got.float(), ref.float(), rtol=rtol, atol=atol)
    cache = args.pop("kv_cache")
    got = both_merges(args, cache, config, counters_for())
    torch.testing.assert_close(got.float(), ref.float(), rtol=rtol, atol=atol)


@pytest.mark.gpu
@pytest.mark.parametrize("capacity", [1024, 8192, 32768])
@pytest.mark.parametrize("n", [1, 4, 16, 64])
def test_gpu_one_launch_merge_kimi_sizes(n, capacity):
    """Kimi-Linear sizes, bf16, 16-token blocks, random lengths up to the capacity (one full, one
    of 1 token): the default launch with the layer's counters, then its kernel config at several
    split counts merged both ways. Each matches the reference within the bf16 tolerance, the
    two merges give the same bits, and every counter is back at 0."""
    args = make_gpu_case(n, capacity, 16, torch.bfloat16, seed=n + capacity)
    ref = mla_decode_paged_ref(**args)
    rtol, atol = tolerance(torch.bfloat16)
    counters = counters_for()
    got = mla_decode_paged(**args, counters=counters)
    torch.testing.assert_close(got.float(), ref.float(), rtol=rtol, atol=atol)
    assert not counters.any()
    default = mla_decode_config(n, 32, 512, capacity, num_sms(), counters=DECODE_COUNTERS)
    cache = args.pop("kv_cache")
    for splits in sorted({default.num_splits, 2, 5, 16, 33}):
        got = both_merges(args, cache, replace(default, num_splits=splits), counters)
        torch.testing.assert_close(got.float(), ref.float(), rtol=rtol, atol=atol)


@pytest.mark.gpu
def test_gpu_fp32_uses_ieee_products():
    args = make_gpu_case(4, 2048, 64, torch.float32, seed=1)
    torch.testing.assert_close(mla_decode_paged(**args), mla_decode_paged_ref(**args),
                               rtol=1e-5, atol=1e-5)  # fmt: skip


def capture(fn):
    """`fn()` captured in a CUDA graph after one eager call (compiles outside the capture)."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fn()
    return graph, out


def new_step(static, capacity, gen):
    """New lengths (1..capacity) and queries, written in place as a decode step does."""
    n = static["seq_lens"].shape[0]
    static["seq_lens"].copy_(torch.randint(1, capacity + 1, (n,), generator=gen, device="cuda"))
    static["q_latent"].copy_(torch.randn(static["q_latent"].shape, generator=gen, device="cuda"))


@pytest.mark.gpu
@pytest.mark.parametrize("with_counters", [False, True], ids=["two-launch", "counters"])
@pytest.mark.parametrize("n", [1, 64])
def test_gpu_cuda_graph_replay_is_bit_equal(n, with_counters):
    """Capture once, then change the lengths and queries in place: replay must equal eager.
    With counters, batch 64 takes the one-launch merge (2 splits)."""
    args = make_gpu_case(n, 4096, 64, torch.bfloat16, seed=n)
    static = {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in args.items()}
    counters = counters_for() if with_counters else None
    graph, out = capture(lambda: mla_decode_paged(**static, counters=counters))
    gen = torch.Generator(device="cuda").manual_seed(99)
    for _ in range(3):
        new_step(static, 4096, gen)
        graph.replay()
        torch.cuda.synchronize()
        eager = mla_decode_paged(**static, counters=counters)
        assert same_bits(out, eager)
        assert counters is None or not counters.any()
    assert not math.isnan(out.float().sum().item())


@pytest.mark.gpu
@pytest.mark.parametrize("n,capacity", [(1, 1024), (4, 8192), (16, 8192), (64, 32768)])
def test_gpu_one_launch_merge_graph_replays_reset_counters(n, capacity):
    """The one-launch merge (the default's splits, forced to merge in the split launch) captured
    in a CUDA graph and replayed with new lengths and queries: every replay equals the eager
    two-launch form bit for bit and leaves every counter at 0. A counter left set would make the
    next replay's merge run early (wrong output) or never (stale output)."""
    args = make_gpu_case(n, capacity, 16, torch.bfloat16, seed=n + capacity)
    static = {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in args.items()}
    config = mla_decode_config(n, 32, 512, capacity, num_sms(), counters=DECODE_COUNTERS)
    assert config.num_splits > 1
    one, two = replace(config, fused_merge=True), replace(config, fused_merge=False)
    counters = counters_for()
    graph, out = capture(lambda: launch_mla_decode(**static, config=one, counters=counters))
    assert not counters.any()
    gen = torch.Generator(device="cuda").manual_seed(7)
    for _ in range(3):
        new_step(static, capacity, gen)
        graph.replay()
        torch.cuda.synchronize()
        assert not counters.any()
        assert same_bits(out, launch_mla_decode(**static, config=two))
        rtol, atol = tolerance(torch.bfloat16)
        ref = mla_decode_paged_ref(**static)
        torch.testing.assert_close(out.float(), ref.float(), rtol=rtol, atol=atol)
