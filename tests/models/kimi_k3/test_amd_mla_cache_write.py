"""The fused MLA latent cache write (Triton, under TRITON_INTERPRET=1 on CPU) against the unfused
ops it replaces (`rms_norm`, cat, indexed write): bit-identical cache entries for every kv_a /
cache dtype pair, from a strided kv_a into scattered blocks of a strided cache, untouched rows
untouched, negative slots skipped; its torch reference; validation; and on a GPU, Kimi-Linear
sizes (bit-identical to the unfused GPU ops) and CUDA-graph replay."""

import pytest
import torch

from vllm.model_executor.layers.ops.rms_norm import rms_norm
from vllm.models.kimi_k3.amd.ops.mla_cache_write import mla_cache_write, mla_cache_write_ref

BF16, FP32 = torch.bfloat16, torch.float32


def make_case(
    tokens, latent, rope, num_blocks, block_size, kv_dtype, cache_dtype, device="cpu", extra=24,
    pad=8,
):  # fmt: skip
    """kv_a as a column slice of a wider projection (after `extra` columns), weights around 1, a
    cache that is a strided view (each token row padded by `pad`) filled with values the write
    must leave alone, and distinct slots drawn over all blocks."""
    gen = torch.Generator(device).manual_seed(tokens + latent + num_blocks)
    width = latent + rope
    proj = torch.randn(tokens, extra + width, generator=gen, device=device) * 3
    kv_a = proj.to(kv_dtype)[:, extra:]
    weight = (1 + 0.1 * torch.randn(latent, generator=gen, device=device)).to(kv_dtype)
    padded = torch.randn(num_blocks, block_size, width + pad, generator=gen, device=device)
    cache = padded.to(cache_dtype)[:, :, :width]
    perm = torch.randperm(num_blocks * block_size, generator=gen, device=device)
    return kv_a, weight, cache, perm[:tokens]


def unfused(kv_a, weight, eps, cache, slots):
    """Today's ops: the norm op (its Triton kernel here), cat, and the indexed write."""
    latent = weight.shape[0]
    entries = torch.cat([rms_norm(kv_a[:, :latent], weight, eps), kv_a[:, latent:]], -1)
    block_size = cache.shape[1]
    cache[slots // block_size, slots % block_size] = entries.to(cache.dtype)


def written_rows(cache, slots):
    mask = torch.zeros(cache.shape[:2], dtype=torch.bool, device=cache.device)
    mask.view(-1)[slots] = True
    return mask


@pytest.mark.parametrize(
    "kv_dtype,cache_dtype", [(BF16, BF16), (FP32, FP32), (FP32, BF16), (BF16, FP32)], ids=str
)
def test_bit_identical_to_the_unfused_ops(kv_dtype, cache_dtype, triton_launches):
    kv_a, weight, cache, slots = make_case(9, 40, 8, 6, 4, kv_dtype, cache_dtype)
    before = cache.clone()
    expected = cache.clone()
    unfused(kv_a, weight, 1e-6, expected, slots)
    assert triton_launches["_rms_norm_kernel"] == 1
    mla_cache_write(kv_a, weight, 1e-6, cache, slots)
    assert triton_launches["_mla_cache_write_kernel"] == 1
    assert torch.equal(cache, expected)
    written = written_rows(cache, slots)
    assert torch.equal(cache[~written], before[~written])
    assert not torch.equal(cache[written], before[written])
    # The rope columns are copied, not normed.
    assert torch.equal(cache.view(-1, 48)[slots, 40:], kv_a[:, 40:].to(cache_dtype))


@pytest.mark.parametrize("kv_dtype", [BF16, FP32], ids=str)
def test_matches_the_torch_reference(kv_dtype):
    """The reference sums in torch's order: bf16 entries within one ulp, fp32 ones within a few."""
    kv_a, weight, cache, slots = make_case(7, 64, 16, 5, 3, kv_dtype, kv_dtype)
    expected = cache.clone()
    mla_cache_write_ref(kv_a, weight, 1e-5, expected, slots)
    mla_cache_write(kv_a, weight, 1e-5, cache, slots)
    rtol = 2**-7 if kv_dtype == BF16 else 2**-20
    torch.testing.assert_close(cache, expected, rtol=rtol, atol=0)


@pytest.mark.parametrize("fused", [True, False], ids=["kernel", "reference"])
def test_negative_slots_write_nothing(fused, triton_launches):
    kv_a, weight, cache, _ = make_case(4, 32, 8, 3, 4, FP32, FP32)
    slots = torch.tensor([-1, 6, -3, 0], dtype=torch.int32)
    before = cache.clone()
    (mla_cache_write if fused else mla_cache_write_ref)(kv_a, weight, 1e-6, cache, slots)
    assert triton_launches["_mla_cache_write_kernel"] == int(fused)
    changed = (cache != before).any(-1).view(-1).nonzero().flatten().tolist()
    assert changed == [0, 6]
    expected = before.clone()
    unfused(kv_a[[1, 3]], weight, 1e-6, expected, slots[[1, 3]].long())
    assert torch.equal(cache, expected)


def test_no_tokens_launch_nothing(triton_launches):
    kv_a, weight, cache, slots = make_case(0, 32, 8, 2, 4, BF16, BF16)
    before = cache.clone()
    mla_cache_write(kv_a, weight, 1e-6, cache, slots)
    assert triton_launches["_mla_cache_write_kernel"] == 0
    assert torch.equal(cache, before)


def test_without_the_interpreter_the_reference_runs(monkeypatch, triton_launches):
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    kv_a, weight, cache, slots = make_case(5, 32, 8, 3, 4, FP32, FP32)
    expected = cache.clone()
    mla_cache_write_ref(kv_a, weight, 1e-6, expected, slots)
    mla_cache_write(kv_a, weight, 1e-6, cache, slots)
    assert triton_launches["_mla_cache_write_kernel"] == 0
    assert torch.equal(cache, expected)


def _bad(**changes):
    kv_a, weight, cache, slots = make_case(3, 32, 8, 2, 4, FP32, FP32)
    args = dict(kv_a=kv_a, weight=weight, eps=1e-6, kv_cache=cache, slot_mapping=slots)
    return {**args, **changes}


@pytest.mark.parametrize(
    "changes,match",
    [
        (dict(kv_a=torch.zeros(3, 40, dtype=torch.int32)), "kv_a must be bfloat16"),
        (dict(kv_a=torch.zeros(3, 2, 40)), "kv_a must be a 2-D tensor"),
        (dict(kv_a=torch.zeros(40, 3).t()), "kv_a must have unit stride"),
        (dict(weight=torch.ones(40)), r"need 0 < L < L \+ R"),
        (dict(weight=torch.ones(1, 32)), "weight must be a 1-D tensor"),
        (dict(kv_cache=torch.zeros(2, 4, 41)), r"kv_cache must be \[num_blocks, block_size, 40\]"),
        (dict(kv_cache=torch.zeros(8, 40)), "kv_cache must be a 3-D tensor"),
        (dict(slot_mapping=torch.arange(4)), r"slot_mapping must be \[3\]"),
        (dict(slot_mapping=torch.arange(3.0)), "contiguous int32 or int64"),
        (dict(slot_mapping=torch.arange(6)[::2]), "contiguous int32 or int64"),
        (dict(weight=torch.ones(32, device="meta")), "weight is on meta"),
    ],
)
def test_validation(changes, match):
    with pytest.raises(ValueError, match=match):
        mla_cache_write(**_bad(**changes))


@pytest.mark.gpu
@pytest.mark.parametrize("tokens", [1, 8, 256, 8192])
def test_gpu_kimi_sizes_bit_identical_to_the_unfused_ops(tokens):
    """The model's layouts: bf16 kv_a sliced from the merged q | kv_a projection (32 heads x 192,
    then latent 512 and rope 64), a contiguous cache of 16-token blocks. The same cache as the
    GPU's rms_norm kernel, cat and indexed write (the kernels share tile, warps and access
    alignment, hence the fp32 reduction order)."""
    kv_a, weight, cache, slots = make_case(
        tokens, 512, 64, 1024, 16, BF16, BF16, "cuda", extra=32 * 192, pad=0
    )
    expected = cache.clone()
    unfused(kv_a, weight, 1e-6, expected, slots)
    mla_cache_write(kv_a, weight, 1e-6, cache, slots)
    assert torch.equal(cache, expected)


@pytest.mark.gpu
def test_gpu_cuda_graph_replay_writes_the_new_slots():
    kv_a, weight, cache, slots = make_case(8, 512, 64, 64, 16, BF16, BF16, "cuda", 6144, 0)
    static_kv_a, static_slots = kv_a.clone(), slots.clone()
    mla_cache_write(static_kv_a, weight, 1e-6, cache, static_slots)  # compile outside the graph
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        mla_cache_write(static_kv_a, weight, 1e-6, cache, static_slots)
    new_kv_a, new_slots = kv_a.flip(0) * 0.5, (slots + 37) % (64 * 16)
    static_kv_a.copy_(new_kv_a)
    static_slots.copy_(new_slots)
    expected = cache.clone()
    unfused(new_kv_a, weight, 1e-6, expected, new_slots)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(cache, expected)
