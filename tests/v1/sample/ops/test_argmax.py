"""The greedy argmax kernels (under TRITON_INTERPRET=1 on CPU) against `torch.argmax`: equal
indices, ties to the first index, NaN, signed zeros, infinities and denormals ordered as torch
orders them, whatever the chunking; argument checks; on a GPU, every bf16 bit pattern, the
engine's sizes and CUDA-graph replay."""

import pytest
import torch

from vllm.v1.sample.ops.argmax import BLOCK, MAX_KERNEL_ROWS, argmax, argmax_ref, split_count

ANY_ROWS = 1 << 30  # max_kernel_rows: the kernels at any row count

DTYPES = [torch.bfloat16, torch.float16, torch.float32]


def few_values(shape, dtype, seed, device="cpu"):
    """Integers in [-3, 3]: many ties for the maximum, in every chunk."""
    gen = torch.Generator(device=device).manual_seed(seed)
    return torch.randint(-3, 4, shape, generator=gen, device=device).to(dtype)


def launched(counts) -> tuple[int, int]:
    return counts["_argmax_partial_kernel"], counts["_argmax_pick_kernel"]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize(
    "rows,vocab,target",
    [
        (1, 1, 2048),
        (3, 5, 2048),
        (2, 2049, 2048),  # a chunk of one column
        (1, 5 * 2048 + 7, 2048),  # five full chunks and a short one
        (2, 5 * 2048 + 7, 1),  # one chunk a row: the step loop and its short last step
        (1, 10000, 3),  # chunks of two steps, the last one short
    ],
)
def test_matches_torch(rows, vocab, target, dtype, triton_launches):
    x = few_values((rows, vocab), dtype, seed=rows * vocab + target)
    got = argmax(x, target_programs=target)
    assert launched(triton_launches) == (1, 1)  # the kernels, not the reference
    assert got.dtype == torch.int64 and got.shape == (rows,)
    assert torch.equal(got, x.argmax(dim=-1))


def test_first_of_tied_maxima_across_chunks(triton_launches):
    """The maximum at the last column of a chunk, at the first of the next and in the last chunk:
    the first wins, whichever program saw it; a lone maximum at the very last column is found."""
    vocab = 3 * BLOCK + 5
    x = torch.zeros(4, vocab)
    x[0, [BLOCK - 1, BLOCK, vocab - 1]] = 2.0
    x[1, [vocab - 1, 2 * BLOCK]] = 2.0
    x[2, vocab - 1] = 1.0
    x[3] = -1.0  # all equal: index 0
    for target in (1, 2, 4, 8):
        assert split_count(4, vocab, target)[0] == min(max(1, -(-target // 4)), 4)
        got = argmax(x, target_programs=target)
        assert got.tolist() == [BLOCK - 1, 2 * BLOCK, vocab - 1, 0]
    assert launched(triton_launches) == (4, 4)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_special_values_order_as_torch(dtype, triton_launches):
    """Every ordered pair of special values as a two-column row, and rows of specials."""
    tiny = torch.finfo(dtype).tiny
    specials = torch.tensor(
        [float("nan"), float("inf"), float("-inf"), 0.0, -0.0, tiny / 4, -tiny / 4, tiny,
         -tiny, 1.0, -1.0, torch.finfo(dtype).max, torch.finfo(dtype).min, -float("nan")],
        dtype=dtype,
    )  # fmt: skip
    assert specials[5] != 0 and specials[6] != 0  # the denormals survive the cast
    pairs = torch.cartesian_prod(specials, specials)
    assert torch.equal(argmax(pairs, max_kernel_rows=ANY_ROWS), pairs.argmax(dim=-1))
    rows = torch.stack([specials.roll(i) for i in range(len(specials))])
    assert torch.equal(argmax(rows), rows.argmax(dim=-1))
    no_nan = rows[:, 1:-1]
    assert torch.equal(argmax(no_nan), no_nan.argmax(dim=-1))
    assert launched(triton_launches) == (3, 3)


def test_row_and_column_strides(triton_launches):
    wide = few_values((5, 300), torch.float32, seed=1)
    view = wide[:, 20:280]  # row stride 300, read in place
    assert torch.equal(argmax(view), view.argmax(dim=-1))
    transposed = few_values((90, 4), torch.bfloat16, seed=2).t()  # column stride 4: copied
    assert torch.equal(argmax(transposed), transposed.argmax(dim=-1))
    assert launched(triton_launches) == (2, 2)


def test_reference_and_dispatch(triton_launches):
    x = few_values((3, 40), torch.float32, seed=3)
    assert torch.equal(argmax_ref(x), x.argmax(dim=-1))
    x64 = x.double()  # not a kernel dtype: the reference
    assert torch.equal(argmax(x64), x64.argmax(dim=-1))
    assert argmax(x.to("meta")).shape == (3,)
    assert torch.equal(argmax(x, max_kernel_rows=2), x.argmax(dim=-1))  # more rows: torch's
    many = few_values((MAX_KERNEL_ROWS + 1, 8), torch.bfloat16, seed=4)
    assert torch.equal(argmax(many), many.argmax(dim=-1))
    assert launched(triton_launches) == (0, 0)
    argmax(many[:MAX_KERNEL_ROWS])
    argmax(x, max_kernel_rows=3)
    assert launched(triton_launches) == (2, 2)


def test_no_rows_launch_nothing(triton_launches):
    got = argmax(torch.empty(0, 7))
    assert got.shape == (0,) and got.dtype == torch.int64
    assert launched(triton_launches) == (0, 0)


def test_rejects_bad_inputs():
    with pytest.raises(ValueError, match=r"\[N, V\]"):
        argmax(torch.zeros(4))
    with pytest.raises(ValueError, match="V must be"):
        argmax(torch.zeros(2, 0))
    with pytest.raises(ValueError, match="floating-point"):
        argmax(torch.zeros(2, 3, dtype=torch.int32))
    with pytest.raises(ValueError, match="target_programs"):
        argmax(torch.zeros(2, 3), target_programs=0)
    with pytest.raises(ValueError, match="max_kernel_rows"):
        argmax(torch.zeros(2, 3), max_kernel_rows=-1)
    with pytest.raises(ValueError, match="torch.Tensor"):
        argmax([[1.0, 2.0]])


def test_split_count_covers_the_row_once():
    for rows in (1, 3, 64, 256, 5000):
        for vocab in (1, 2047, 2048, 163840, 2**20 + 1):
            for target in (1, 100, 2048, 10**6):
                splits, chunk = split_count(rows, vocab, target)
                assert chunk % BLOCK == 0 and 1 <= splits <= 1024
                assert (splits - 1) * chunk < vocab <= splits * chunk
    assert split_count(1, 163840) == (80, BLOCK)  # one step a program at batch 1


@pytest.mark.gpu
def test_every_bf16_pattern_on_gpu(triton_launches):
    """All 65536 bf16 bit patterns, shuffled in each row, with and without the NaNs; and pairs of
    random patterns as two-column rows."""
    gen = torch.Generator(device="cuda").manual_seed(0)
    every = torch.arange(-(2**15), 2**15, dtype=torch.int32, device="cuda").to(torch.int16)
    rows = torch.stack([every[torch.randperm(every.numel(), generator=gen, device="cuda")]
                        for _ in range(8)]).view(torch.bfloat16)  # fmt: skip
    assert torch.equal(argmax(rows), rows.argmax(dim=-1))
    magnitude = rows.view(torch.int16) & 0x7FFF
    no_nan = rows.masked_fill(magnitude > 0x7F80, 0.0)
    assert torch.equal(argmax(no_nan), no_nan.argmax(dim=-1))
    pairs = every[torch.randint(0, every.numel(), (1 << 20, 2), generator=gen, device="cuda")]
    pairs = pairs.view(torch.bfloat16)
    assert torch.equal(argmax(pairs, max_kernel_rows=ANY_ROWS), pairs.argmax(dim=-1))
    assert launched(triton_launches) == (3, 3)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("rows", [1, 8, 64, 256, 1000])
def test_engine_sizes_on_gpu(rows, dtype, triton_launches):
    """Kimi-Linear's vocabulary at the benchmark's batch sizes, ties and a few NaN rows."""
    x = few_values((rows, 163840), dtype, seed=rows, device="cuda")
    x[::7, 12345] = float("nan")
    for target in (64, 2048, 8192):
        got = argmax(x, target_programs=target, max_kernel_rows=ANY_ROWS)
        assert torch.equal(got, x.argmax(dim=-1))
    assert launched(triton_launches) == (3, 3)


@pytest.mark.gpu
def test_graph_replay_on_gpu():
    x = few_values((4, 163840), torch.bfloat16, seed=5, device="cuda")
    out = argmax(x)  # compiles outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = argmax(x)
    for seed in (6, 7):
        x.copy_(few_values(x.shape, x.dtype, seed=seed, device="cuda"))
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, x.argmax(dim=-1))
