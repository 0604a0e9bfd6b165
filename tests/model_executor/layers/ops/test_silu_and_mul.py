"""The SiluAndMul op (under TRITON_INTERPRET=1 on CPU) against torch's `F.silu(gate) * up`, its
argument checks and the `SiluAndMul` module's dispatch; on a GPU, bit for bit against torch on
every bf16 gate value and at prefill sizes, also under CUDA-graph replay.

On CPU the interpreter evaluates `exp` with numpy, torch with its own vectorised `exp`; the two
may differ by an fp32 ulp, which can move silu across a rounding boundary of the output dtype. So
there the kernel is compared bit for bit with the reference's formula evaluated with numpy's
`exp` (every other operation and rounding the same), and with `silu_and_mul_ref` within that one
fp32 ulp. On a GPU both sides call CUDA's `expf`: the test is `torch.equal`.
"""

import numpy as np
import pytest
import torch

from vllm.model_executor.layers.activation import SiluAndMul
from vllm.model_executor.layers.ops.silu_and_mul import silu_and_mul, silu_and_mul_ref

DTYPES = [torch.bfloat16, torch.float16, torch.float32]


def rows_of(shape, dtype, seed, device="cpu", scale=4.0):
    gen = torch.Generator(device=device).manual_seed(seed)
    return (torch.randn(shape, generator=gen, device=device) * scale).to(dtype)


def numpy_exp_reference(x: torch.Tensor) -> torch.Tensor:
    """`silu_and_mul_ref`'s operations and roundings with numpy's fp32 `exp` (the interpreter's)."""
    gate, up = x.float().chunk(2, dim=-1)
    with np.errstate(over="ignore"):  # exp(-gate) of a very negative gate is inf, as intended
        e = torch.from_numpy(np.exp(-gate.numpy()))
    return ((gate / (1 + e)).to(x.dtype).float() * up).to(x.dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", [(1, 16), (5, 80), (3, 2, 2048), (2, 2600)])
def test_matches_reference(shape, dtype, triton_launches):
    x = rows_of(shape, dtype, seed=sum(shape))
    got = silu_and_mul(x)
    assert triton_launches["_silu_and_mul_kernel"] == 1  # the kernel, not its reference
    assert got.dtype == dtype and got.shape == (*shape[:-1], shape[-1] // 2)
    assert got.is_contiguous()
    assert torch.equal(got, numpy_exp_reference(x))
    # Against torch's own exp (both within ~1 ulp of exp, so ~2 ulps apart): a 16-bit silu moves
    # by at most one ulp of the dtype (a rounding boundary crossed) and the product by at most two
    # (2 eps relative); an fp32 silu by ~3 fp32 ulps, the product by ~4 (4 eps).
    ref = silu_and_mul_ref(x)
    eps = torch.finfo(dtype).eps
    torch.testing.assert_close(got, ref, rtol=(4 if dtype == torch.float32 else 2) * eps, atol=0)


def test_reads_a_row_strided_view(triton_launches):
    wide = rows_of((6, 200), torch.bfloat16, seed=3)
    x = wide[:, 20:180]  # row stride 200, unit inner stride: read in place
    got = silu_and_mul(x)
    assert triton_launches["_silu_and_mul_kernel"] == 1
    assert torch.equal(got, numpy_exp_reference(x.contiguous()))


@pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning")  # the interpreter's
def test_extreme_gates(triton_launches):
    """Large negative gates (exp overflows to inf: silu is -0), large positive, zeros, infs."""
    gate = torch.tensor([-1e4, -100.0, -88.5, -20.0, -0.0, 0.0, 1e-30, 20.0, 100.0, 3e38])
    x = torch.cat([gate, torch.full_like(gate, 1.5)]).unsqueeze(0)
    for dtype in (torch.float32, torch.bfloat16):
        got = silu_and_mul(x.to(dtype))
        assert torch.equal(got, numpy_exp_reference(x.to(dtype)))
    assert triton_launches["_silu_and_mul_kernel"] == 2


def test_module_dispatches_to_the_op(triton_launches):
    x = rows_of((4, 64), torch.bfloat16, seed=4)
    assert torch.equal(SiluAndMul()(x), silu_and_mul(x))
    assert triton_launches["_silu_and_mul_kernel"] == 2
    # fp64 (the fp64 test references) and meta tensors take the torch reference.
    x64 = x.double()
    assert torch.equal(SiluAndMul()(x64), silu_and_mul_ref(x64))
    assert SiluAndMul()(x.to("meta")).shape == (4, 32)
    assert triton_launches["_silu_and_mul_kernel"] == 2


def test_empty_inputs_launch_nothing(triton_launches):
    assert silu_and_mul(torch.empty(0, 64)).shape == (0, 32)
    assert silu_and_mul(torch.empty(3, 0)).shape == (3, 0)
    assert triton_launches["_silu_and_mul_kernel"] == 0


def test_rejects_bad_inputs():
    with pytest.raises(ValueError, match="even"):
        silu_and_mul(torch.zeros(2, 7))
    with pytest.raises(ValueError, match="scalar"):
        silu_and_mul(torch.tensor(1.0))
    with pytest.raises(ValueError, match="floating-point"):
        silu_and_mul(torch.zeros(2, 8, dtype=torch.int32))
    with pytest.raises(ValueError, match="unit stride"):
        silu_and_mul(torch.zeros(8, 2).t())


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_every_16_bit_gate_on_gpu(dtype, triton_launches):
    """Every 16-bit pattern (denormals, infs and NaNs included) as the gate, against a few ups."""
    gate = torch.arange(-(2**15), 2**15, dtype=torch.int32).to(torch.int16).view(dtype).cuda()
    for up in (1.0, -3.0, 1e-3, 7.5):
        x = torch.cat([gate, torch.full_like(gate, up)]).unsqueeze(0)
        got, ref = silu_and_mul(x), silu_and_mul_ref(x)
        torch.testing.assert_close(got, ref, rtol=0, atol=0, equal_nan=True)
    assert triton_launches["_silu_and_mul_kernel"] == 4


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("rows,inter", [(1, 1024), (8192 * 9, 1024), (7, 9216)])
def test_prefill_sizes_on_gpu(rows, inter, dtype):
    x = rows_of((rows, 2 * inter), dtype, seed=rows, device="cuda")
    assert torch.equal(silu_and_mul(x), silu_and_mul_ref(x))


@pytest.mark.gpu
def test_graph_replay_on_gpu():
    x = rows_of((8, 2048), torch.bfloat16, seed=8, device="cuda")
    eager = silu_and_mul(x)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        silu_and_mul(x)  # warm-up: compile outside the capture
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = silu_and_mul(x)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(captured, eager)
