"""`moe_weighted_sum` (under TRITON_INTERPRET=1 on CPU) against its fixed-order fp32 reference, bit
for bit, with y in (token, slot) order and read through an inverse permutation; its checks; on a
GPU the same at Kimi-Linear's prefill size (8192 tokens, top-8 plus the fused shared expert)."""

import pytest
import torch

from vllm.model_executor.layers.fused_moe.weighted_sum import (
    moe_weighted_sum,
    moe_weighted_sum_ref,
)


def make_case(tokens, topk, hidden, dtype, seed, device="cpu"):
    gen = torch.Generator(device=device).manual_seed(seed)
    y = torch.randn(tokens * topk, hidden, generator=gen, device=device).to(dtype)
    weights = torch.rand(tokens, topk, generator=gen, device=device)
    order = torch.randperm(tokens * topk, generator=gen, device=device)
    inverse = torch.empty_like(order).scatter_(0, order, torch.arange(order.numel(), device=device))
    return y, weights, order, inverse


@pytest.mark.parametrize("out_dtype", [torch.bfloat16, torch.float32], ids=str)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32], ids=str)
@pytest.mark.parametrize("tokens,topk,hidden", [(1, 1, 8), (5, 4, 40), (3, 9, 600), (2, 3, 1030)])
def test_matches_reference_bit_for_bit(tokens, topk, hidden, dtype, out_dtype, triton_launches):
    y, weights, order, inverse = make_case(tokens, topk, hidden, dtype, seed=tokens * hidden)
    expected = moe_weighted_sum_ref(y, weights, out_dtype)
    got = moe_weighted_sum(y, weights, out_dtype)
    # y as the grouped paths leave it: sorted (row i holds (token, slot) row order[i]).
    got_sorted = moe_weighted_sum(y[order], weights, out_dtype, inverse=inverse.to(torch.int32))
    assert triton_launches["_moe_weighted_sum_kernel"] == 2
    assert got.dtype == out_dtype and got.shape == (tokens, hidden)
    assert torch.equal(got, expected)
    assert torch.equal(got_sorted, expected)


def test_reference_is_the_fixed_order_sum():
    """The reference adds the rounded fp32 products slot by slot (not torch.sum's order)."""
    y, weights, _, _ = make_case(4, 9, 24, torch.bfloat16, seed=1)
    acc = torch.zeros(4, 24)
    for j in range(9):
        for t in range(4):
            acc[t] = acc[t] + (y[t * 9 + j].float() * weights[t, j])
    assert torch.equal(moe_weighted_sum_ref(y, weights, torch.float32), acc)


def test_reads_strided_weights_and_rows(triton_launches):
    y, weights, order, inverse = make_case(3, 4, 48, torch.bfloat16, seed=2)
    wide = torch.zeros(12, 64, dtype=torch.bfloat16)
    wide[:, 8:56] = y[order]
    weights_t = weights.t().contiguous().t()  # column-major [T, K]
    got = moe_weighted_sum(wide[:, 8:56], weights_t, torch.bfloat16, inverse=inverse)
    assert triton_launches["_moe_weighted_sum_kernel"] == 1
    assert torch.equal(got, moe_weighted_sum_ref(y, weights, torch.bfloat16))


def test_zero_tokens_and_fp64_take_no_kernel(triton_launches):
    out = moe_weighted_sum(torch.empty(0, 16), torch.empty(0, 4), torch.bfloat16)
    assert out.shape == (0, 16) and out.dtype == torch.bfloat16
    y, weights, _, inverse = make_case(2, 2, 8, torch.float64, seed=3)
    got = moe_weighted_sum(y, weights, torch.float64, inverse=inverse)
    assert torch.equal(got, moe_weighted_sum_ref(y, weights, torch.float64, inverse=inverse))
    assert triton_launches["_moe_weighted_sum_kernel"] == 0


def test_rejects_bad_inputs():
    y, weights, _, inverse = make_case(2, 3, 8, torch.bfloat16, seed=4)
    with pytest.raises(ValueError, match="T \\* K = 6 rows"):
        moe_weighted_sum(y[:5], weights, torch.bfloat16)
    with pytest.raises(ValueError, match="inverse must be"):
        moe_weighted_sum(y, weights, torch.bfloat16, inverse=inverse[:5])
    with pytest.raises(ValueError, match="inverse must be"):
        moe_weighted_sum(y, weights, torch.bfloat16, inverse=inverse.float())
    with pytest.raises(ValueError, match="unit stride"):
        moe_weighted_sum(torch.zeros(8, 6).t(), weights, torch.bfloat16)
    # The kernel reads inverse at unit stride: a strided view was read wrong, silently.
    with pytest.raises(ValueError, match="inverse must have unit stride"):
        moe_weighted_sum(y, weights, torch.bfloat16, inverse=inverse.repeat_interleave(2)[::2])
    with pytest.raises(ValueError, match="2-D"):
        moe_weighted_sum(y.view(2, 3, 8), weights, torch.bfloat16)
    with pytest.raises(ValueError, match="dtype must be"):
        moe_weighted_sum(y, weights, torch.int32)


@pytest.mark.gpu
@pytest.mark.parametrize("sorted_rows", [False, True])
def test_prefill_size_on_gpu(sorted_rows, triton_launches):
    y, weights, order, inverse = make_case(8192, 9, 2304, torch.bfloat16, seed=5, device="cuda")
    expected = moe_weighted_sum_ref(y, weights, torch.bfloat16)
    if sorted_rows:
        got = moe_weighted_sum(y[order], weights, torch.bfloat16, inverse=inverse)
    else:
        got = moe_weighted_sum(y, weights, torch.bfloat16)
    assert triton_launches["_moe_weighted_sum_kernel"] == 1
    assert torch.equal(got, expected)
