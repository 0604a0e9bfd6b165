"""`gather_rows` (under TRITON_INTERPRET=1 on CPU) against `index_select(order // k)`, bit for bit:
dtypes, a hidden size no column block divides, strided rows, both index widths, k 1 and 9, tail
row blocks, empty inputs; its checks (on every device, strides the kernel cannot read included);
on a GPU the same at Kimi-Linear's prefill size."""

import pytest
import torch

from vllm.model_executor.layers.fused_moe.gather_rows import (
    GatherRowsConfig,
    gather_rows,
    gather_rows_ref,
)

# Small tiles so the interpreter's programs stay few but rows and columns both have tail blocks.
SMALL = GatherRowsConfig(block_rows=4, block_cols=16, num_warps=1)


def make_case(tokens, k, hidden, dtype, seed, index_dtype=torch.int32, device="cpu"):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(tokens, hidden, generator=gen).to(dtype)
    # A permutation of every (token, slot) row, as group_rows sorts them.
    order = torch.randperm(tokens * k, generator=gen).to(index_dtype)
    return x.to(device), order.to(device)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32], ids=str)
@pytest.mark.parametrize("index_dtype", [torch.int32, torch.int64], ids=str)
@pytest.mark.parametrize("tokens,k,hidden", [(5, 9, 40), (7, 1, 37), (3, 8, 16)])
def test_matches_index_select(tokens, k, hidden, dtype, index_dtype, triton_launches):
    x, order = make_case(tokens, k, hidden, dtype, tokens * hidden + k, index_dtype)
    got = gather_rows(x, order, k, config=SMALL)
    assert triton_launches["_gather_rows_kernel"] == 1
    assert got.dtype == dtype and got.shape == (tokens * k, hidden) and got.is_contiguous()
    assert torch.equal(got, x.index_select(0, order.long() // k))


def test_default_config_and_repeated_rows(triton_launches):
    """The default tile (one row block, a masked column tail), with rows taken more than once and
    rows not taken at all: `order` need not be a permutation."""
    x, _ = make_case(6, 3, 300, torch.bfloat16, seed=1)
    order = torch.tensor([17, 0, 0, 5, 3, 17, 2], dtype=torch.int32)
    got = gather_rows(x, order, 3)
    assert triton_launches["_gather_rows_kernel"] == 1
    assert torch.equal(got, x[[5, 0, 0, 1, 1, 5, 0]])
    assert torch.equal(got, gather_rows_ref(x, order, 3))


def test_reads_strided_rows(triton_launches):
    x, order = make_case(5, 9, 24, torch.bfloat16, seed=2)
    wide = torch.zeros(5, 40, dtype=torch.bfloat16)
    wide[:, 8:32] = x
    got = gather_rows(wide[:, 8:32], order, 9, config=SMALL)
    assert triton_launches["_gather_rows_kernel"] == 1
    assert torch.equal(got, gather_rows_ref(x, order, 9))


def test_empty_launches_nothing(triton_launches):
    x, _ = make_case(4, 2, 16, torch.bfloat16, seed=3)
    out = gather_rows(x, torch.empty(0, dtype=torch.int32), 2)
    assert out.shape == (0, 16) and out.dtype == torch.bfloat16
    out = gather_rows(torch.empty(4, 0), torch.arange(8), 2)
    assert out.shape == (8, 0)
    assert triton_launches["_gather_rows_kernel"] == 0


def test_other_dtypes_take_the_reference(triton_launches):
    x, order = make_case(3, 2, 8, torch.float64, seed=4)
    assert torch.equal(gather_rows(x, order, 2), gather_rows_ref(x, order, 2))
    assert triton_launches["_gather_rows_kernel"] == 0


@pytest.mark.parametrize("interpret", ["1", "0"], ids=["kernel", "reference"])
def test_rejects_strides_the_kernel_cannot_read(interpret, monkeypatch, triton_launches):
    """As `moe_weighted_sum` does: a ValueError on every device, whether the kernel or the
    reference would run, rather than a silent fallback that hides a slower path."""
    monkeypatch.setenv("TRITON_INTERPRET", interpret)
    x, order = make_case(3, 2, 8, torch.bfloat16, seed=4)
    columns = x.t().contiguous().t()  # strided on H: what index_select accepts
    with pytest.raises(ValueError, match="x must have unit stride on its last dim"):
        gather_rows(columns, order, 2)
    with pytest.raises(ValueError, match="order must have unit stride"):
        gather_rows(x, order.repeat_interleave(2)[::2], 2)
    # One column or one index has no stride to get wrong.
    one_column = torch.zeros(4, 3, dtype=torch.bfloat16).t()[:, :1]
    assert torch.equal(gather_rows(one_column, order, 2), gather_rows_ref(one_column, order, 2))
    one_index = order.repeat_interleave(2)[:2:2]
    assert torch.equal(gather_rows(x, one_index, 2), gather_rows_ref(x, one_index, 2))
    assert triton_launches["_gather_rows_kernel"] == (2 if interpret == "1" else 0)


def test_rejects_bad_inputs():
    x, order = make_case(3, 2, 8, torch.bfloat16, seed=5)
    with pytest.raises(ValueError, match="2-D"):
        gather_rows(x.view(3, 2, 4), order, 2)
    with pytest.raises(ValueError, match="order is on meta"):
        gather_rows(x, order.to("meta"), 2)
    with pytest.raises(ValueError, match="1-D"):
        gather_rows(x, order.view(2, 3), 2)
    with pytest.raises(ValueError, match="int32 / int64"):
        gather_rows(x, order.float(), 2)
    with pytest.raises(ValueError, match="k must be"):
        gather_rows(x, order, 0)
    with pytest.raises(ValueError, match="k must be"):
        gather_rows(x, order, 2.0)
    with pytest.raises(ValueError, match="power of two"):
        GatherRowsConfig(block_rows=3, block_cols=16, num_warps=1)


@pytest.mark.gpu
@pytest.mark.parametrize("index_dtype", [torch.int32, torch.int64], ids=str)
def test_prefill_size_on_gpu(index_dtype, triton_launches):
    x, order = make_case(8192, 9, 2304, torch.bfloat16, 6, index_dtype, device="cuda")
    got = gather_rows(x, order, 9)
    assert triton_launches["_gather_rows_kernel"] == 1
    assert torch.equal(got, x.index_select(0, order // 9))
