"""The small-M GEMMs (PTPC FP8 and bf16) against their torch references, the references against
exact math, split-K, input validation, and the dispatch by M (the PTPC kernel class, F.linear).

CPU runs the Triton kernel under the interpreter (tests/conftest.py); GPU-only checks carry the
`gpu` marker. "Exact" data are small integers: every fp32 partial sum is then exact, so kernel and
reference must agree bit for bit whatever their summation order.
"""

import pytest
import torch
import torch.nn.functional as F

import vllm.platforms
from vllm.model_executor.kernels.linear import _POSSIBLE_FP8_KERNELS
from vllm.model_executor.kernels.linear import small_m_gemm as smg
from vllm.model_executor.kernels.linear.scaled_mm.pytorch import (
    RowWiseTorchFP8ScaledMMLinearKernel,
    dequantized_matmul,
)
from vllm.model_executor.kernels.linear.scaled_mm.ScaledMMLinearKernel import (
    FP8ScaledMMLinearLayerConfig,
)
from vllm.model_executor.kernels.linear.scaled_mm.triton import (
    TritonSmallMFP8ScaledMMLinearKernel,
)
from vllm.model_executor.layers.fusion.quant_activation import QuantizedActivation
from vllm.model_executor.layers.quantization.utils.fp8_per_token import per_token_fp8_quant
from vllm.model_executor.layers.quantization.utils.quant_utils import (
    kFp8DynamicTokenSym,
    kFp8StaticChannelSym,
)
from vllm.platforms import CudaPlatform, PlatformEnum, current_platform

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
FP8 = current_platform.fp8_dtype()
SPLIT_CONFIGS = [None, smg.SmallMGemmConfig(16, 32, 1), smg.SmallMGemmConfig(32, 64, 3)]


def small_ints(gen: torch.Generator, *shape: int, bound: int = 16) -> torch.Tensor:
    """Integers in [-bound, bound] (exact in e4m3 and bf16 up to 16 and 256)."""
    return torch.randint(-bound, bound + 1, shape, generator=gen).float()


def fp8_operands(m, n, k, bias, seed, exact=True, device=DEVICE):
    """(xq, x_scale [M, 1], wq [N, K] row-major (the codes whose [K, N] transposed view the PTPC
    layer stores), w_scale [N, 1], bias [N] bf16 or None)."""
    gen = torch.Generator().manual_seed(seed)
    if exact:
        x, w = small_ints(gen, m, k), small_ints(gen, n, k)
    else:  # full-range codes, as quantization produces
        x = torch.randn(m, k, generator=gen) * 120
        w = torch.randn(n, k, generator=gen) * 120
    xq, wq = x.to(FP8), w.to(FP8)
    x_scale = torch.rand(m, 1, generator=gen) * 0.01 + 1e-3
    w_scale = torch.rand(n, 1, generator=gen) * 0.01 + 1e-3
    b = torch.randn(n, generator=gen).to(torch.bfloat16) if bias else None
    return [t if t is None else t.to(device) for t in (xq, x_scale, wq, w_scale, b)]


def bf16_ulp(v: torch.Tensor) -> torch.Tensor:
    return torch.exp2(torch.floor(torch.log2(v.abs().clamp(min=2**-126))) - 7)


# ---------------------------------------------------------------------------------------------
# FP8
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("m", [1, 3, 16])
@pytest.mark.parametrize("n,k", [(37, 200), (100, 333)])
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("config", SPLIT_CONFIGS, ids=["default", "split1", "split3"])
def test_fp8_kernel_equals_reference_on_exact_sums(m, n, k, bias, config, triton_launches):
    xq, xs, wq, ws, b = fp8_operands(m, n, k, bias, seed=m * 1000 + n + k)
    out = smg.fp8_small_m_gemm(xq, xs, wq, ws, b, config=config)
    assert triton_launches["_small_m_gemm_kernel"] == 1
    ref = smg.fp8_small_m_gemm_ref(xq, xs, wq, ws, b)
    assert out.shape == (m, n) and out.dtype == torch.bfloat16
    assert torch.equal(out, ref)
    # The reference is the PTPC fallback's dequantized matmul, and exact math rounded once.
    assert torch.equal(ref, dequantized_matmul(xq, wq.t(), torch.bfloat16, xs, ws, b))
    exact = (xq.double() @ wq.double().t()).float() * xs * ws.t()
    if b is not None:
        exact = exact + b.float()
    assert torch.equal(ref, exact.to(torch.bfloat16))


@pytest.mark.parametrize("m", [1, 3, 16])
@pytest.mark.parametrize("out_dtype", [torch.bfloat16, torch.float32])
def test_fp8_kernel_within_fp32_summation_of_reference(m, out_dtype):
    """Full-range codes: only the fp32 summation order differs from the reference."""
    n, k = 45, 515
    xq, xs, wq, ws, b = fp8_operands(m, n, k, True, seed=m, exact=False)
    out = smg.fp8_small_m_gemm(xq, xs, wq, ws, b, out_dtype).float()
    ref = smg.fp8_small_m_gemm_ref(xq, xs, wq, ws, b, out_dtype).float()
    magnitude = (xq.float().abs() @ wq.float().abs().t()) * xs * ws.t()
    bound = 2 * k * 2**-24 * magnitude  # two fp32 sums of k terms, in different orders
    if out_dtype == torch.bfloat16:
        bound = bound + bf16_ulp(ref)  # the two may round to neighbouring bf16 values
    assert ((out - ref).abs() <= bound).all()


def test_fp8_kernel_reads_any_weight_strides():
    xq, xs, wq, ws, b = fp8_operands(3, 37, 200, True, seed=6)
    column_major = wq.t().contiguous().t()
    assert column_major.stride() == (1, 37)
    out = smg.fp8_small_m_gemm(xq, xs, column_major, ws, b)
    assert torch.equal(out, smg.fp8_small_m_gemm(xq, xs, wq, ws, b))


def test_fp8_split_k_is_deterministic_and_leaves_semaphores_zero():
    xq, xs, wq, ws, b = fp8_operands(5, 70, 600, True, seed=3, exact=False)
    first = smg.fp8_small_m_gemm(xq, xs, wq, ws, b, config=smg.SmallMGemmConfig(32, 64, 4))
    again = smg.fp8_small_m_gemm(xq, xs, wq, ws, b, config=smg.SmallMGemmConfig(32, 64, 4))
    assert torch.equal(first, again)
    assert not smg.reserve_semaphores(xq.device).any()


def test_fp8_nan_token_scale_poisons_only_its_row():
    xq, xs, wq, ws, _ = fp8_operands(3, 40, 64, False, seed=4)
    xs[1] = float("nan")
    out = smg.fp8_small_m_gemm(xq, xs, wq, ws)
    assert out[1].isnan().all() and not out[[0, 2]].isnan().any()


def test_fp8_default_config_fills_the_gpu_without_empty_splits():
    for m, n, k in [(1, 2304, 4096), (32, 2304, 4096), (1, 4096, 2304), (16, 8192, 512)]:
        config = smg.default_config(m, n, k, FP8, torch.device("cpu"))
        n_tiles = -(-n // config.block_n)
        k_tiles = -(-k // config.block_k)
        # two programs per SM of an H200, unless K is too short to split further
        assert n_tiles * config.split_k >= 2 * 132 or k_tiles < 4 * config.split_k
        per_split = -(-k_tiles // config.split_k)
        assert (config.split_k - 1) * per_split < k_tiles  # the last split is not empty


@pytest.mark.parametrize(
    "change,message",
    [
        (dict(xq=lambda t: t[:0]), "1 to 64 rows"),
        (dict(xq=lambda t: t[:1].expand(65, -1)), "1 to 64 rows"),
        (dict(xq=lambda t: t.float()), "xq must be one of"),
        (dict(wq=lambda t: t[:, :-1]), r"weight must be \[N, 64\]"),
        (dict(x_scale=lambda t: t.double()), "x_scale must be"),
        (dict(w_scale=lambda t: t[:-1]), "w_scale must be"),
        (dict(bias=lambda t: t[:-1]), "bias must be"),
        (dict(xq=lambda t: t.t().contiguous().t()), "unit stride"),
        (dict(out_dtype=torch.int8), "out_dtype must be"),
        (dict(config=smg.SmallMGemmConfig(8, 64, 1)), "block_n >= 16"),
    ],
)
def test_fp8_kernel_rejects_bad_input(change, message):
    xq, xs, wq, ws, b = fp8_operands(3, 40, 64, True, seed=5)
    args = dict(xq=xq, x_scale=xs, wq=wq, w_scale=ws, bias=b)
    for name, edit in change.items():
        args[name] = edit(args[name]) if callable(edit) else edit
    with pytest.raises(ValueError, match=message):
        smg.fp8_small_m_gemm(**args)


# ---------------------------------------------------------------------------------------------
# bf16
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("m", [1, 3, 16])
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("config", SPLIT_CONFIGS, ids=["default", "split1", "split3"])
def test_bf16_kernel_equals_reference_on_exact_sums(m, bias, config, triton_launches):
    n, k = 53, 301
    gen = torch.Generator().manual_seed(m + 7)
    x = small_ints(gen, m, k).to(torch.bfloat16).to(DEVICE)
    weight = small_ints(gen, k, n).to(torch.bfloat16).to(DEVICE).t()  # any strides
    b = torch.randn(n, generator=gen).to(torch.bfloat16).to(DEVICE) if bias else None
    out = smg.small_m_gemm(x, weight, b, config=config)
    assert triton_launches["_small_m_gemm_kernel"] == 1
    ref = smg.small_m_gemm_ref(x, weight, b)
    assert out.shape == (m, n) and out.dtype == torch.bfloat16
    assert torch.equal(out, ref)
    exact = (x.double() @ weight.double().t()).float()
    if b is not None:
        exact = exact + b.float()
    assert torch.equal(ref, exact.to(torch.bfloat16))


@pytest.mark.parametrize("m", [1, 16])
def test_bf16_kernel_within_fp32_summation_of_reference(m):
    n, k = 45, 515
    gen = torch.Generator().manual_seed(m)
    x = torch.randn(m, k, generator=gen).to(torch.bfloat16).to(DEVICE)
    weight = torch.randn(n, k, generator=gen).to(torch.bfloat16).to(DEVICE)
    out = smg.small_m_gemm(x, weight).float()
    ref = smg.small_m_gemm_ref(x, weight).float()
    bound = 2 * k * 2**-24 * (x.float().abs() @ weight.float().abs().t()) + bf16_ulp(ref)
    assert ((out - ref).abs() <= bound).all()


def test_bf16_kernel_rejects_bad_input():
    x = torch.ones(2, 64, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="weight must be"):
        smg.small_m_gemm(x, torch.ones(8, 64, dtype=torch.float16))
    with pytest.raises(ValueError, match="x must be one of"):
        smg.small_m_gemm(x.float(), torch.ones(8, 64))


# ---------------------------------------------------------------------------------------------
# Dispatch by M
# ---------------------------------------------------------------------------------------------


def test_fp8_selection_by_m():
    threshold = smg.FP8_SMALL_M_THRESHOLD
    assert 1 <= threshold <= smg.MAX_M
    assert [smg.use_fp8_small_m_gemm(m) for m in (0, 1, threshold, threshold + 1, 256)] == [
        False, True, True, False, False,
    ]  # fmt: skip


def test_cuda_prefers_the_small_m_ptpc_kernel():
    assert _POSSIBLE_FP8_KERNELS[PlatformEnum.CUDA][:2] == [
        TritonSmallMFP8ScaledMMLinearKernel,
        RowWiseTorchFP8ScaledMMLinearKernel,
    ]


@pytest.mark.parametrize("capability,supported", [((8, 0), False), ((9, 0), True)])
def test_small_m_ptpc_kernel_needs_cuda_sm89(monkeypatch, capability, supported):
    platform = CudaPlatform()
    platform.__dict__["device_capability"] = capability  # cached_property: no GPU needed
    monkeypatch.setattr(vllm.platforms, "current_platform", platform)
    assert TritonSmallMFP8ScaledMMLinearKernel.is_supported()[0] is supported


def ptpc_kernel_and_layer(n: int, k: int, seed: int):
    """The small-M PTPC kernel and a layer holding what Fp8PtpcOnlineLinearMethod leaves:
    `weight` [K, N] (a view of row-major [N, K] codes), `weight_scale` [N, 1]."""
    config = FP8ScaledMMLinearLayerConfig(
        kFp8DynamicTokenSym, kFp8StaticChannelSym, (n, k), torch.bfloat16, torch.bfloat16
    )
    _, _, wq, ws, _ = fp8_operands(1, n, k, False, seed=seed)
    layer = torch.nn.Module()
    layer.weight = torch.nn.Parameter(wq.t(), requires_grad=False)
    layer.weight_scale = torch.nn.Parameter(ws, requires_grad=False)
    return TritonSmallMFP8ScaledMMLinearKernel(config), layer


@pytest.mark.parametrize("m", [1, smg.FP8_SMALL_M_THRESHOLD, smg.FP8_SMALL_M_THRESHOLD + 1])
def test_ptpc_kernel_takes_the_small_m_gemm_up_to_the_threshold(monkeypatch, triton_launches, m):
    kernel, layer = ptpc_kernel_and_layer(48, 96, seed=m)
    calls = []
    rowwise = RowWiseTorchFP8ScaledMMLinearKernel.apply_scaled_mm

    def record(self, *args):
        calls.append(args[0].shape[0])
        return rowwise(self, *args)

    monkeypatch.setattr(RowWiseTorchFP8ScaledMMLinearKernel, "apply_scaled_mm", record)
    x = torch.randn(m, 96, generator=torch.Generator().manual_seed(m)).to(torch.bfloat16)
    q, scale = per_token_fp8_quant(x.to(DEVICE))
    qa = QuantizedActivation(q, scale, torch.bfloat16, x.shape, kFp8DynamicTokenSym)
    out = kernel.apply_weights(layer, qa)
    small = m <= smg.FP8_SMALL_M_THRESHOLD
    assert triton_launches["_small_m_gemm_kernel"] == int(small)
    assert calls == ([] if small else [m])  # the rowwise _scaled_mm path above the threshold
    ref = smg.fp8_small_m_gemm_ref(q, scale, layer.weight.t(), layer.weight_scale)
    bound = 2 * 96 * 2**-24 * (q.float().abs() @ layer.weight.float().abs()) * scale
    bound = bound * layer.weight_scale.t() + bf16_ulp(ref.float())
    assert ((out.float() - ref.float()).abs() <= bound).all()


def test_bf16_selection_rules():
    threshold = smg.BF16_SMALL_M_THRESHOLD
    weight = torch.ones(8, 32, dtype=torch.bfloat16)

    def fits(x, w=weight):
        return smg.small_m_gemm_fits(x, w)

    assert fits(torch.ones(threshold, 32, dtype=torch.bfloat16))
    assert fits(torch.ones(1, 1, 32, dtype=torch.bfloat16))
    assert not fits(torch.ones(threshold + 1, 32, dtype=torch.bfloat16))
    assert not fits(torch.ones(2, 32))  # fp32
    assert not fits(torch.ones(2, 32, dtype=torch.float16))  # dtype differs from the weight
    assert not fits(torch.ones(32, 2, dtype=torch.bfloat16).t())  # K not contiguous
    assert not fits(torch.ones(2, 32, dtype=torch.bfloat16, requires_grad=True))
    with torch.no_grad():
        assert fits(torch.ones(2, 32, dtype=torch.bfloat16, requires_grad=True))
    # CPU tensors never take it: unquantized_linear is F.linear there.
    x = torch.randn(2, 32, generator=torch.Generator().manual_seed(0)).to(torch.bfloat16)
    assert not smg.use_small_m_gemm(x, weight)
    assert torch.equal(smg.unquantized_linear(x, weight), F.linear(x, weight))


# ---------------------------------------------------------------------------------------------
# GPU
# ---------------------------------------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.parametrize("m", [1, 16, 32])
def test_gpu_fp8_kernel_at_o_proj_shape(m):
    """Kimi-Linear's o_proj (K=4096 -> N=2304) with the default split-K launch: within the fp32
    summation bound of the reference, bitwise repeatable, and the same under CUDA-graph replay."""
    if not current_platform.is_cuda():
        pytest.skip("the FP8 small-M kernel is the CUDA PTPC path")
    xq, xs, wq, ws, b = fp8_operands(m, 2304, 4096, True, seed=m, exact=False)
    out = smg.fp8_small_m_gemm(xq, xs, wq, ws, b)
    ref = smg.fp8_small_m_gemm_ref(xq, xs, wq, ws, b).float()
    magnitude = (xq.float().abs() @ wq.float().abs().t()) * xs * ws.t()
    assert ((out.float() - ref).abs() <= 2 * 4096 * 2**-24 * magnitude + bf16_ulp(ref)).all()
    assert torch.equal(out, smg.fp8_small_m_gemm(xq, xs, wq, ws, b))
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = smg.fp8_small_m_gemm(xq, xs, wq, ws, b)
    for _ in range(3):
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(captured, out)
    assert not smg.reserve_semaphores(xq.device).any()


@pytest.mark.gpu
def test_gpu_unquantized_linear_takes_small_m_gemm(triton_launches):
    if not current_platform.is_cuda():
        pytest.skip("the bf16 small-M kernel is used on CUDA only")
    gen = torch.Generator().manual_seed(9)
    weight = torch.randn(4096, 2304, generator=gen).to(torch.bfloat16).cuda()
    x = torch.randn(1, 2304, generator=gen).to(torch.bfloat16).cuda()
    with torch.no_grad():
        out = smg.unquantized_linear(x, weight)
    assert triton_launches["_small_m_gemm_kernel"] == 1
    ref = x.float() @ weight.float().t()
    bound = 2 * 2304 * 2**-24 * (x.float().abs() @ weight.float().abs().t()) + bf16_ulp(ref)
    assert ((out.float() - ref).abs() <= bound).all()
    x = torch.randn(smg.BF16_SMALL_M_THRESHOLD + 1, 2304, generator=gen).to(torch.bfloat16).cuda()
    with torch.no_grad():
        assert torch.equal(smg.unquantized_linear(x, weight), F.linear(x, weight))
    assert triton_launches["_small_m_gemm_kernel"] == 1  # cuBLAS above the threshold
