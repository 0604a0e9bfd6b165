"""The ROCm AITER PTPC kernels, on CPU against a fake `aiter` module (no AMD GPU exists here):
kernel selection and its conditions, the weight layout each kernel makes, and the call it makes."""

import sys
import types

import pytest
import torch
from ptpc_layer import K, N, ptpc_o_proj

import vllm.platforms
from vllm.model_executor.kernels.linear.scaled_mm import aiter as aiter_kernels
from vllm.model_executor.kernels.linear.scaled_mm.pytorch import dequantized_matmul
from vllm.model_executor.layers.fusion.quant_activation import (
    QuantizedActivation,
    get_input_quant_key,
)
from vllm.model_executor.layers.quantization.utils.fp8_per_token import per_token_fp8_quant
from vllm.model_executor.layers.quantization.utils.quant_utils import kFp8DynamicTokenSym
from vllm.platforms import RocmPlatform

SHUFFLE_MARK = 0.5  # the fake shuffle scales codes by this, so an unshuffled weight is detectable


class FakeAiter:
    """A stand-in `aiter` package: records calls, computes with plain torch."""

    def __init__(self, root, per_token=(), bpreshuffle=(), tuned_dtype=torch.float8_e4m3fn):
        self.calls = []
        self.module = types.ModuleType("aiter")
        self.module.__file__ = str(root / "aiter" / "__init__.py")
        configs = root / "aiter" / "configs"
        configs.mkdir(parents=True)
        # AITER's tables, keyed by (M, N, K, q_dtype_w); a8w8's holds int8 GEMMs beside FP8.
        for name, shapes in (
            (aiter_kernels._TUNED_PER_TOKEN_CSV, per_token),
            (aiter_kernels._TUNED_BPRESHUFFLE_CSV, bpreshuffle),
        ):
            rows = "".join(
                f"gfx950,256,{m},{n},{k},{dtype},0,0,1.0,kernel\n"
                for n, k in shapes
                for m in (1, 128)
                for dtype in (tuned_dtype, torch.int8)
            )
            header = "gfx,cu_num,M,N,K,q_dtype_w,kernelId,splitK,us,kernelName\n"
            (configs / name).write_text(header + rows)
        self.module.hipb_mm = self.hipb_mm
        self.module.gemm_a8w8_bpreshuffle = self.gemm_a8w8_bpreshuffle
        self.module.gemm_a8w8_CK = self.gemm_a8w8_CK
        self.shuffle = types.ModuleType("aiter.ops.shuffle")
        self.shuffle.shuffle_weight = self.shuffle_weight

    def install(self, monkeypatch):
        monkeypatch.setitem(sys.modules, "aiter", self.module)
        monkeypatch.setitem(sys.modules, "aiter.ops", types.ModuleType("aiter.ops"))
        monkeypatch.setitem(sys.modules, "aiter.ops.shuffle", self.shuffle)

    def shuffle_weight(self, w):
        assert w.shape == (N, K) and w.is_contiguous()
        self.calls.append("shuffle_weight")
        return (w.float() * SHUFFLE_MARK).to(w.dtype)

    def hipb_mm(self, a, b, solution_index, bias, out_dtype, scaleA, scaleB, scaleOut, bpreshuffle):
        assert bpreshuffle and b.shape == (K, N) and scaleB.shape == (1, N)
        self.calls.append(("hipb_mm", a.dtype, tuple(a.shape), tuple(scaleA.shape)))
        return dequantized_matmul(a, b.float() / SHUFFLE_MARK, out_dtype, scaleA, scaleB.t(), bias)

    def gemm_a8w8_bpreshuffle(self, a, b, a_scale, b_scale, bias, out_dtype):
        assert b.shape == (N, K) and bias is None
        self.calls.append(("gemm_a8w8_bpreshuffle", a.dtype, tuple(a.shape), tuple(a_scale.shape)))
        return dequantized_matmul(
            a, b.float().t() / SHUFFLE_MARK, out_dtype, a_scale, b_scale, None
        )

    def gemm_a8w8_CK(self, a, b, a_scale, b_scale, bias, out_dtype):
        assert b.shape == (N, K)
        self.calls.append(("gemm_a8w8_CK", a.dtype, tuple(a.shape), tuple(a_scale.shape)))
        return dequantized_matmul(a, b.t(), out_dtype, a_scale, b_scale, bias)


@pytest.fixture
def rocm(monkeypatch, tmp_path):
    """A gfx950 ROCm platform with AITER enabled; returns a factory for the fake aiter."""
    monkeypatch.setattr(vllm.platforms, "current_platform", RocmPlatform(gcn_arch="gfx950:xnack-"))
    monkeypatch.setenv("VLLM_ROCM_USE_AITER", "1")
    aiter_kernels._tuned_shapes.cache_clear()

    def make(**kwargs):
        fake = FakeAiter(tmp_path, **kwargs)
        fake.install(monkeypatch)
        return fake

    yield make
    aiter_kernels._tuned_shapes.cache_clear()


@pytest.mark.parametrize(
    "env,tables,expected",
    [
        ({"VLLM_ROCM_USE_AITER_LINEAR_HIPBMM": "1"}, {},
         "AiterHipbMMPerTokenFp8ScaledMMLinearKernel"),
        ({}, {"bpreshuffle": [(N, K)], "per_token": [(N, K)]},
         "AiterPreshuffledPerTokenFp8ScaledMMLinearKernel"),
        ({}, {"per_token": [(N, K)]}, "AiterPerTokenFp8ScaledMMLinearKernel"),
        # Past the AITER kernels, gfx950 takes hipBLASLt's rowwise _scaled_mm (upstream's order).
        ({}, {"per_token": [(N, 512)]}, "RowWiseTorchFP8ScaledMMLinearKernel"),
        ({"VLLM_ROCM_USE_AITER_LINEAR": "0"}, {"per_token": [(N, K)]},
         "RowWiseTorchFP8ScaledMMLinearKernel"),
    ],
    ids=["hipbmm-opt-in", "tuned-bpreshuffle", "tuned-per-token", "untuned", "linear-off"],
)  # fmt: skip
def test_selection_follows_upstreams_conditions(rocm, monkeypatch, env, tables, expected):
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    rocm(**tables)
    layer = ptpc_o_proj()
    assert type(layer.fp8_linear).__name__ == expected
    assert get_input_quant_key(layer) == kFp8DynamicTokenSym


@pytest.mark.parametrize("tuned_dtype", [torch.float8_e4m3fnuz, torch.int8])
def test_a_shape_tuned_for_another_dtype_is_not_tuned(rocm, tuned_dtype):
    """AITER tunes each GEMM per weight dtype (`q_dtype_w`), and upstream asks for the
    platform's FP8 (gfx950: e4m3fn): a shape tuned only for gfx94x's e4m3fnuz, or for int8,
    selected the CK kernels all the same."""
    rocm(per_token=[(N, K)], bpreshuffle=[(N, K)], tuned_dtype=tuned_dtype)
    assert type(ptpc_o_proj().fp8_linear).__name__ == "RowWiseTorchFP8ScaledMMLinearKernel"


def test_nothing_is_selected_from_aiter_when_it_is_off(rocm, monkeypatch):
    monkeypatch.setenv("VLLM_ROCM_USE_AITER", "0")
    rocm(per_token=[(N, K)], bpreshuffle=[(N, K)])
    assert type(ptpc_o_proj().fp8_linear).__name__ == "RowWiseTorchFP8ScaledMMLinearKernel"


@pytest.mark.parametrize(
    "env,tables,gemm,weight_shape",
    [
        ({"VLLM_ROCM_USE_AITER_LINEAR_HIPBMM": "1"}, {}, "hipb_mm", (K, N)),
        ({}, {"bpreshuffle": [(N, K)]}, "gemm_a8w8_bpreshuffle", (N, K)),
        ({}, {"per_token": [(N, K)]}, "gemm_a8w8_CK", (N, K)),
    ],
)  # fmt: skip
def test_layout_and_call_match_the_portable_kernel(
    rocm, monkeypatch, env, tables, gemm, weight_shape
):
    reference = ptpc_o_proj()  # CPU platform: the portable fallback on the same weights
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    fake = rocm(**tables)
    layer = ptpc_o_proj()
    assert layer.weight.shape == weight_shape
    assert ("shuffle_weight" in fake.calls) == (gemm != "gemm_a8w8_CK")

    x = torch.randn(5, K, generator=torch.Generator().manual_seed(0)).to(torch.bfloat16)
    q, scale = per_token_fp8_quant(x)
    qa = QuantizedActivation(q, scale, x.dtype, x.shape, kFp8DynamicTokenSym)
    out = layer(qa)[0]
    call = [c for c in fake.calls if c != "shuffle_weight"][-1]
    assert call == (gemm, q.dtype, (5, K), (5, 1))  # FP8 [M, K] and per-token [M, 1] scales
    assert torch.equal(out, reference(qa)[0])
    assert torch.equal(layer(x)[0], out)  # a plain input is quantized with the same numerics
