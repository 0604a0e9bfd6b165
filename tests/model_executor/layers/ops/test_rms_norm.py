"""The RMSNorm op and its fused residual add (under TRITON_INTERPRET=1 on CPU) against the torch
reference, the argument checks, and the `RMSNorm` layer's two calling conventions; on a GPU the
Kimi-Linear sizes, also under CUDA-graph replay."""

import pytest
import torch

from vllm.model_executor.layers.layernorm import RMSNorm
from vllm.model_executor.layers.ops.rms_norm import (
    fused_add_rms_norm,
    fused_add_rms_norm_ref,
    rms_norm,
    rms_norm_ref,
)

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
EPS = 1e-6


def rows_of(shape, dtype, seed, device=DEVICE, scale=1.0):
    gen = torch.Generator(device=device).manual_seed(seed)
    return (torch.randn(shape, generator=gen, device=device) * scale).to(dtype)


def weight_of(hidden, dtype, seed, device=DEVICE):
    return (1 + 0.2 * rows_of((hidden,), torch.float32, seed, device)).to(dtype)


def assert_close_to_ref(got, ref):
    """Same fp32 math up to the order of the sum of squares and rsqrt's ulps, one rounding to the
    output dtype last: fp32 outputs agree to a few ulps, bf16 ones to one bf16 ulp (2^-7 relative
    at most)."""
    assert got.dtype == ref.dtype and got.shape == ref.shape
    rtol = 1e-6 if got.dtype == torch.float32 else 2**-7
    torch.testing.assert_close(got.float(), ref.float(), rtol=rtol, atol=0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("hidden", [40, 96, 512, 2304])
@pytest.mark.parametrize("rows", [1, 3, 17])
def test_rms_norm_matches_reference(rows, hidden, dtype, triton_launches):
    x = rows_of((rows, hidden), dtype, seed=rows * hidden, scale=3.0)
    w = weight_of(hidden, dtype, seed=hidden)
    got = rms_norm(x, w, EPS)
    assert triton_launches["_rms_norm_kernel"] == 1  # the kernel, not its reference
    assert got.is_contiguous()
    assert_close_to_ref(got, rms_norm_ref(x, w, EPS))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("hidden", [40, 96, 2304])
@pytest.mark.parametrize("rows", [1, 5])
def test_fused_add_rms_norm_matches_reference(rows, hidden, dtype, triton_launches):
    x = rows_of((rows, hidden), dtype, seed=rows + hidden)
    residual = rows_of((rows, hidden), dtype, seed=rows + hidden + 1, scale=4.0)
    w = weight_of(hidden, dtype, seed=hidden)
    normed, new_residual = fused_add_rms_norm(x, residual, w, EPS)
    assert triton_launches["_rms_norm_kernel"] == 1
    # The new stream is the separate add's, bit for bit.
    assert new_residual.dtype == dtype and torch.equal(new_residual, x + residual)
    assert_close_to_ref(normed, fused_add_rms_norm_ref(x, residual, w, EPS)[0])
    # The norm reads the rounded sum: the same kernel on that sum gives the same bits.
    assert torch.equal(normed, rms_norm(x + residual, w, EPS))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_eps_counts_for_small_rows(dtype, triton_launches):
    """Rows whose mean square is near ``eps`` (and an all-zero row, which is zero, not NaN): at the
    unit-scale rows above eps moves the output by ~1e-7 relative, under any tolerance."""
    hidden = 96
    x = rows_of((3, hidden), dtype, seed=6, scale=1e-3)
    x[2] = 0
    w = weight_of(hidden, dtype, seed=7)
    got = rms_norm(x, w, EPS)
    normed, _ = fused_add_rms_norm(x, torch.zeros_like(x), w, EPS)
    assert triton_launches["_rms_norm_kernel"] == 2
    ref = rms_norm_ref(x, w, EPS)
    assert_close_to_ref(got, ref)
    assert_close_to_ref(normed, ref)
    assert torch.equal(got[2], torch.zeros_like(got[2]))


def test_leading_dims_and_strided_rows(triton_launches):
    """[..., D] inputs are flattened to rows; a 2-D column slice is read in place."""
    hidden = 40
    w = weight_of(hidden, torch.bfloat16, seed=1)
    x3 = rows_of((2, 3, hidden), torch.bfloat16, seed=2)
    got = rms_norm(x3, w, EPS)
    assert got.shape == x3.shape
    assert_close_to_ref(got, rms_norm_ref(x3, w, EPS))
    wide = rows_of((4, hidden + 24), torch.bfloat16, seed=3)
    res = rows_of((4, hidden + 8), torch.bfloat16, seed=4)
    x, r = wide[:, 8 : 8 + hidden], res[:, :hidden]
    normed, new_residual = fused_add_rms_norm(x, r, w, EPS)
    assert torch.equal(new_residual, x + r)
    assert_close_to_ref(normed, rms_norm_ref(x + r, w, EPS))
    assert triton_launches["_rms_norm_kernel"] == 2


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_zero_rows_launch_nothing(dtype, triton_launches):
    x = torch.empty(0, 96, dtype=dtype, device=DEVICE)
    w = weight_of(96, dtype, seed=5)
    out = rms_norm(x, w, EPS)
    normed, new_residual = fused_add_rms_norm(x, x.clone(), w, EPS)
    for t in (out, normed, new_residual):
        assert t.shape == (0, 96) and t.dtype == dtype
    assert triton_launches["_rms_norm_kernel"] == 0


def test_argument_errors():
    x = rows_of((3, 40), torch.bfloat16, seed=6)
    w = weight_of(40, torch.bfloat16, seed=7)
    with pytest.raises(ValueError, match=r"weight must be \[40\]"):
        rms_norm(x, w[:32], EPS)
    with pytest.raises(ValueError, match="residual must match x"):
        fused_add_rms_norm(x, x.float(), w, EPS)
    with pytest.raises(ValueError, match="residual must match x"):
        fused_add_rms_norm(x, x[:2], w, EPS)
    with pytest.raises(ValueError, match="x must have unit stride"):
        rms_norm(rows_of((40, 3), torch.bfloat16, seed=8).t(), w, EPS)
    with pytest.raises(ValueError, match="residual must have unit stride"):
        fused_add_rms_norm(x, rows_of((40, 3), torch.bfloat16, seed=8).t(), w, EPS)
    with pytest.raises(ValueError, match="x must be bfloat16, float16 or float32"):
        rms_norm(x.to(torch.int32), w, EPS)
    with pytest.raises(ValueError, match="hidden size must be in"):
        rms_norm(x[:, :0], w, EPS)
    with pytest.raises(ValueError, match="at least one dim"):
        rms_norm(x[0, 0], w, EPS)


@pytest.mark.parametrize("interpret", ["1", "0"], ids=["kernel", "reference"])
def test_layer_calling_conventions(interpret, monkeypatch):
    """`RMSNorm(x)` returns the normed tensor, `RMSNorm(x, residual)` `(normed, x + residual)`,
    through the kernel or (CPU without the interpreter) the reference."""
    if DEVICE == "cuda" and interpret == "0":
        pytest.skip("CUDA tensors always launch the kernel")
    monkeypatch.setenv("TRITON_INTERPRET", interpret)
    norm = RMSNorm(96, EPS, torch.bfloat16).to(DEVICE)
    norm.weight.data.copy_(weight_of(96, torch.bfloat16, seed=9))
    x = rows_of((5, 96), torch.bfloat16, seed=10)
    residual = rows_of((5, 96), torch.bfloat16, seed=11)
    assert_close_to_ref(norm(x), rms_norm_ref(x, norm.weight, EPS))
    normed, new_residual = norm(x, residual)
    assert torch.equal(new_residual, x + residual)
    assert_close_to_ref(normed, rms_norm_ref(x + residual, norm.weight, EPS))


@pytest.mark.gpu
@pytest.mark.parametrize("rows", [1, 64, 4096])
def test_gpu_kimi_linear_sizes(rows, triton_launches):
    """Hidden 2304 (Kimi-Linear) and 512 (the MLA latent) at decode and prefill row counts."""
    for hidden in (2304, 512):
        x = rows_of((rows, hidden), torch.bfloat16, seed=rows + hidden, device="cuda")
        residual = rows_of((rows, hidden), torch.bfloat16, seed=rows - hidden, device="cuda")
        w = weight_of(hidden, torch.bfloat16, seed=hidden, device="cuda")
        assert_close_to_ref(rms_norm(x, w, EPS), rms_norm_ref(x, w, EPS))
        normed, new_residual = fused_add_rms_norm(x, residual, w, EPS)
        assert torch.equal(new_residual, x + residual)
        assert_close_to_ref(normed, fused_add_rms_norm_ref(x, residual, w, EPS)[0])
    assert triton_launches["_rms_norm_kernel"] == 4


@pytest.mark.gpu
def test_gpu_cuda_graph_replay():
    """The decode path's call captures into a CUDA graph and replays on new inputs."""
    x = rows_of((8, 2304), torch.bfloat16, seed=12, device="cuda")
    residual = rows_of((8, 2304), torch.bfloat16, seed=13, device="cuda")
    w = weight_of(2304, torch.bfloat16, seed=14, device="cuda")
    fused_add_rms_norm(x, residual, w, EPS)  # compile outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        normed, new_residual = fused_add_rms_norm(x, residual, w, EPS)
    x.copy_(rows_of((8, 2304), torch.bfloat16, seed=15, device="cuda"))
    graph.replay()
    assert torch.equal(new_residual, x + residual)
    assert_close_to_ref(normed, fused_add_rms_norm_ref(x, residual, w, EPS)[0])
