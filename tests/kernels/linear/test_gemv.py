"""The small-M GEMV kernels (bf16 and PTPC FP8) against exact fp64 products, their dispatch from
the linear layers, argument errors, and on a GPU: Kimi-Linear's shapes and CUDA-graph replay.

Every comparison uses one bound, from the numerics of vllm/model_executor/kernels/linear/gemv.py:
the kernel sums exact fp32 products in fp32 (K terms: at most about K * 2^-24 * sum |x w| off the
exact sum, plus one fp32 rounding per epilogue step: scales, bias) and rounds once to the output
dtype (at most 2^-8 relative for bf16's 8-bit significand). So

    |out - exact| <= 2^-8 |exact| + (K + 3) * 2^-23 * (sum_k |x_k w_k| (* scales) + |bias|)

with the factor 2 in 2^-23 covering the first-order terms' products. A wrong scale, a dropped bias,
a missed K chunk or row breaks it by orders of magnitude.
"""

from dataclasses import replace

import pytest
import torch

from vllm.model_executor.kernels.linear import gemv as gemv_op
from vllm.model_executor.kernels.linear import gemv_config as gemv_cfg
from vllm.model_executor.kernels.linear.gemv import (
    gemv,
    gemv_batched,
    gemv_batched_ref,
    gemv_fp8,
    gemv_fp8_ref,
    gemv_ref,
)
from vllm.model_executor.kernels.linear.gemv_config import GemvConfig
from vllm.model_executor.kernels.linear.scaled_mm.pytorch import (
    RowWiseTorchFP8ScaledMMLinearKernel,
    dequantized_matmul,
)
from vllm.model_executor.kernels.linear.scaled_mm.ScaledMMLinearKernel import (
    FP8ScaledMMLinearLayerConfig,
)
from vllm.model_executor.layers.linear import ReplicatedLinear
from vllm.model_executor.layers.ops.rms_norm import rms_norm
from vllm.model_executor.layers.quantization.utils.fp8_per_token import per_token_fp8_quant
from vllm.model_executor.layers.quantization.utils.quant_utils import (
    kFp8DynamicTokenSym,
    kFp8StaticChannelSym,
)
from vllm.platforms import current_platform

HAS_GPU = torch.cuda.is_available()
DEVICE = "cuda" if HAS_GPU else "cpu"
FP8 = current_platform.fp8_dtype()

# Interpreter configs: the default, a tail in N and K, split-K (with an uneven last split), dot.
CPU_CONFIGS = {
    "default": None,
    "split": GemvConfig(block_n=8, block_k=32, split_k=3),
    "dot": GemvConfig(block_n=16, block_k=64, use_dot=True),
    # The one-row wide tile (gemv_config.WIDE_TILE), K 200 in one masked step.
    "wide": gemv_cfg.WIDE_TILE,
}


def bf16_case(m: int, n: int, k: int, device: str, seed: int, bias: bool = True):
    gen = torch.Generator(device=device).manual_seed(seed)
    x = torch.randn(m, k, generator=gen, device=device).to(torch.bfloat16)
    w = (torch.randn(n, k, generator=gen, device=device) * k**-0.5).to(torch.bfloat16)
    b = torch.randn(n, generator=gen, device=device).to(torch.bfloat16) if bias else None
    return x, w, b


def fp8_case(m: int, n: int, k: int, device: str, seed: int, bias: bool = False):
    gen = torch.Generator(device=device).manual_seed(seed)
    fp8_max = current_platform.fp8_max()
    # Codes over the whole e4m3 range (subnormals to fp8_max), scales of a few decades.
    a = (torch.randn(m, k, generator=gen, device=device) * fp8_max / 4).clamp(-fp8_max, fp8_max)
    w = (torch.randn(n, k, generator=gen, device=device) * fp8_max / 4).clamp(-fp8_max, fp8_max)
    a_scale = torch.rand(m, 1, generator=gen, device=device) * 1e-2 + 1e-4
    w_scale = torch.rand(n, 1, generator=gen, device=device) * 1e-3 + 1e-5
    b = torch.randn(n, generator=gen, device=device).to(torch.bfloat16) if bias else None
    return a.to(FP8), a_scale, w.to(FP8), w_scale, b


def assert_within_bound(out, x, w, bias=None, x_scale=None, w_scale=None):
    """``out`` against the exact fp64 result, by the module docstring's bound."""
    xd, wd = x.double(), w.double()
    exact, size = xd @ wd.t(), xd.abs() @ wd.abs().t()
    if x_scale is not None:
        scale = x_scale.double().reshape(-1, 1) * w_scale.double().reshape(1, -1)
        exact, size = exact * scale, size * scale
    if bias is not None:
        exact, size = exact + bias.double(), size + bias.double().abs()
    bound = 2**-8 * exact.abs() + (x.shape[1] + 3) * 2**-23 * size
    err = (out.double() - exact).abs()
    assert out.shape == exact.shape
    assert (err <= bound).all(), f"max excess {(err - bound).max().item():.3g}"


# ---------------------------------------------------------------------------------------------
# Kernels under the interpreter (CPU) or on the GPU: small shapes, tails in N and K
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("config", list(CPU_CONFIGS))
@pytest.mark.parametrize("m", [1, 3, 16])
def test_bf16_gemv_matches_exact(triton_launches, config, m):
    x, w, b = bf16_case(m, 37, 200, DEVICE, seed=m)
    out = gemv(x, w, b, config=CPU_CONFIGS[config])
    assert out.dtype == torch.bfloat16
    assert_within_bound(out, x, w, b)
    assert triton_launches["_gemv_kernel"] == 1
    assert triton_launches["_gemv_split_reduce_kernel"] == (config == "split")


@pytest.mark.parametrize("config", list(CPU_CONFIGS))
@pytest.mark.parametrize("m", [1, 3, 16])
def test_fp8_gemv_matches_exact(triton_launches, config, m):
    a, a_scale, w, w_scale, b = fp8_case(m, 37, 200, DEVICE, seed=10 + m, bias=m == 3)
    out = gemv_fp8(a, a_scale, w, w_scale, b, config=CPU_CONFIGS[config])
    assert out.dtype == torch.bfloat16
    assert_within_bound(out, a, w, b, a_scale, w_scale)
    assert triton_launches["_gemv_kernel"] == 1


# tl.dot ("swap AB") under the interpreter: one and three K splits (the last one short), a K tail
# (200 = 6 x 32 + 8), an N tail (37), one M block of 16 padded rows (M = 5) and two M blocks with
# a one-row tail (M = 17, block_m 16), and the default block_m (32 at M = 17).
DOT_CONFIGS = {
    "dot": GemvConfig(block_n=16, block_k=32, use_dot=True, block_m=16),
    "dot_split": GemvConfig(block_n=16, block_k=32, use_dot=True, split_k=3),
}


@pytest.mark.parametrize("config", list(DOT_CONFIGS))
@pytest.mark.parametrize("m", [5, 17])
@pytest.mark.parametrize("bias", [False, True])
def test_bf16_dot_matches_exact(triton_launches, config, m, bias):
    x, w, b = bf16_case(m, 37, 200, DEVICE, seed=40 + m, bias=bias)
    out = gemv(x, w, b, config=DOT_CONFIGS[config])
    assert_within_bound(out, x, w, b)
    assert triton_launches["_gemv_kernel"] == 1
    assert triton_launches["_gemv_split_reduce_kernel"] == (config == "dot_split")


@pytest.mark.parametrize("fp8_mma", [False, True])
@pytest.mark.parametrize("config", list(DOT_CONFIGS))
@pytest.mark.parametrize("m", [5, 17])
@pytest.mark.parametrize("bias", [False, True])
def test_fp8_dot_matches_exact(triton_launches, fp8_mma, config, m, bias):
    a, a_scale, w, w_scale, b = fp8_case(m, 37, 200, DEVICE, seed=50 + m, bias=bias)
    cfg = replace(DOT_CONFIGS[config], fp8_mma=fp8_mma)
    out = gemv_fp8(a, a_scale, w, w_scale, b, config=cfg)
    assert out.dtype == torch.bfloat16
    assert_within_bound(out, a, w, b, a_scale, w_scale)
    assert triton_launches["_gemv_kernel"] == 1
    assert triton_launches["_gemv_split_reduce_kernel"] == (config == "dot_split")


@pytest.mark.parametrize("weight_bytes", [1, 2])
def test_default_config_takes_dot_above_the_gemv_rows(triton_launches, weight_bytes):
    # One row more than the multiply-and-sum's range: the default config is tl.dot, and runs.
    gemv_max = gemv_cfg.FP8_GEMV_MAX_M if weight_bytes == 1 else gemv_cfg.BF16_GEMV_MAX_M
    assert not gemv_cfg.default_config(gemv_max, 37, 200, weight_bytes).use_dot
    assert gemv_cfg.default_config(gemv_max + 1, 37, 200, weight_bytes).use_dot
    if weight_bytes == 1:
        a, a_scale, w, w_scale, b = fp8_case(gemv_max + 1, 37, 200, DEVICE, seed=60, bias=True)
        assert_within_bound(gemv_fp8(a, a_scale, w, w_scale, b), a, w, b, a_scale, w_scale)
    else:
        x, w, b = bf16_case(gemv_max + 1, 37, 200, DEVICE, seed=61)
        assert_within_bound(gemv(x, w, b), x, w, b)
    assert triton_launches["_gemv_kernel"] == 1


def test_dot_default_config_fills_the_h200(monkeypatch):
    # o_proj (4096 -> 2304) and the q/k/v-sized weight on 132 SMs at M = 8..256: the MMA's
    # 64-row side of channels per program, rows in blocks of 16..64, [64, 128] weight tiles (FP8
    # into the FP8 MMA), and enough K splits for one program per SM wherever each split still
    # keeps two K chunks.
    monkeypatch.setattr(gemv_cfg, "num_sms", lambda: 132)
    gemv_cfg.default_config.cache_clear()
    try:
        for weight_bytes, (k, n) in [(1, (4096, 2304)), (2, (4096, 2304)), (2, (2304, 12448))]:
            for m in [8, 16, 32, 64, 128, 256]:
                cfg = gemv_cfg.default_config(m, n, k, weight_bytes)
                cfg.check()
                assert cfg.use_dot and cfg.fp8_mma == (weight_bytes == 1)
                assert (cfg.block_n, cfg.block_k) == (64, 128)
                block_m = min(64, max(16, m))
                programs = -(-n // cfg.block_n) * -(-m // block_m) * cfg.split_k
                assert programs >= 132 or k < 4 * cfg.split_k * cfg.block_k
                assert cfg.split_k == 1 or k >= 2 * cfg.split_k * cfg.block_k
        assert gemv_cfg.default_config(16, 2304, 4096, 1).split_k == 4  # 36 N blocks x 4
    finally:
        gemv_cfg.default_config.cache_clear()


def test_fp8_mma_config_errors():
    x, w, _ = bf16_case(2, 5, 64, "cpu", seed=62)
    for config in (
        GemvConfig(16, 64, fp8_mma=True),
        GemvConfig(16, 16, use_dot=True, fp8_mma=True),
    ):
        with pytest.raises(ValueError, match="fp8_mma needs use_dot and block_k >= 32"):
            gemv(x, w, config=config)
    with pytest.raises(ValueError, match="split_k and num_stages must be >= 1"):
        gemv(x, w, config=GemvConfig(16, 64, split_k=0))


def test_more_rows_than_a_block_and_fp16(triton_launches):
    # M = 65: the default (tl.dot, 64 rows per program) takes a second M block of one row; fp16
    # weights; no bias.
    x, w, _ = bf16_case(65, 9, 64, DEVICE, seed=3, bias=False)
    x, w = x.half(), w.half()
    assert gemv_cfg.block_rows(gemv_cfg.default_config(65, 9, 64, 2), 65) == 64
    out = gemv(x, w)
    assert out.dtype == torch.float16
    assert_within_bound(out, x, w)
    assert triton_launches["_gemv_kernel"] == 1


def test_strided_rows_and_transposed_fp8_view(triton_launches):
    # x rows with padding between them; the weight as the FP8 layers hold it, a [K, N] view.
    a, a_scale, w, w_scale, _ = fp8_case(2, 24, 96, DEVICE, seed=4)
    padded = torch.zeros(2, 128, dtype=torch.uint8, device=DEVICE).view(FP8)
    padded[:, :96] = a
    b_view = w.t()
    out = gemv_fp8(padded[:, :96], a_scale, b_view.t(), w_scale.reshape(1, -1))
    assert torch.equal(out, gemv_fp8(a, a_scale, w, w_scale))
    assert triton_launches["_gemv_kernel"] == 2  # the kernel both times, not its reference
    assert_within_bound(out, a, w, None, a_scale, w_scale)


def test_fp8_reference_is_dequantized_matmul():
    a, a_scale, w, w_scale, b = fp8_case(5, 16, 64, "cpu", seed=5, bias=True)
    ref = gemv_fp8_ref(a, a_scale, w, w_scale, b)
    assert torch.equal(ref, dequantized_matmul(a, w.t(), torch.bfloat16, a_scale, w_scale, b))


def test_cpu_without_interpreter_runs_the_references(monkeypatch, triton_launches):
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    x, w, b = bf16_case(3, 12, 40, "cpu", seed=6)
    assert torch.equal(gemv(x, w, b), gemv_ref(x, w, b))
    a, a_scale, wq, w_scale, _ = fp8_case(3, 12, 40, "cpu", seed=7)
    assert torch.equal(gemv_fp8(a, a_scale, wq, w_scale), gemv_fp8_ref(a, a_scale, wq, w_scale))
    assert triton_launches["_gemv_kernel"] == 0


def test_empty_inputs(triton_launches):
    x, w, b = bf16_case(1, 5, 8, DEVICE, seed=8)
    assert gemv(x[:0], w).shape == (0, 5)
    no_k = gemv(x[:, :0], w[:, :0], b)  # K = 0: the bias alone
    assert torch.equal(no_k, b.expand(1, 5))
    assert triton_launches["_gemv_kernel"] == 0


# ---------------------------------------------------------------------------------------------
# Argument errors
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "change,message",
    [
        (lambda x, w, b: (x[0], w, b), r"x must be \[M, K\]"),
        (lambda x, w, b: (x, w[:, :8], b), "x and weight must share K"),
        (lambda x, w, b: (x.float(), w.float(), b), "share one dtype"),
        (lambda x, w, b: (x, w.half(), b), "share one dtype"),
        (lambda x, w, b: (x, w.t().contiguous().t(), b), "unit stride on K"),
        (lambda x, w, b: (x, w, b[:3]), r"bias must be a contiguous \[5\]"),
        (lambda x, w, b: (x, w, b.half()), "bias must be torch.bfloat16"),
    ],
)
def test_bf16_argument_errors(change, message):
    x, w, b = bf16_case(2, 5, 16, "cpu", seed=9)
    with pytest.raises(ValueError, match=message):
        gemv(*change(x, w, b))


@pytest.mark.parametrize(
    "change,message",
    [
        (lambda a, s, w, t: (a, s, w.to(torch.bfloat16), t), "share one dtype"),
        (lambda a, s, w, t: (a, s[:1], w, t), "a_scale must hold 2 contiguous float32"),
        (lambda a, s, w, t: (a, s.double(), w, t), "a_scale must hold 2"),
        (lambda a, s, w, t: (a, s, w, t[:4]), "w_scale must hold 5"),
        (lambda a, s, w, t: (a, s, w, t.repeat(1, 2)[:, 1]), "w_scale must hold 5"),
    ],
)
def test_fp8_argument_errors(change, message):
    a, a_scale, w, w_scale, _ = fp8_case(2, 5, 16, "cpu", seed=11)
    with pytest.raises(ValueError, match=message):
        gemv_fp8(*change(a, a_scale, w, w_scale))


def test_fp8_out_dtype_and_config_errors():
    a, a_scale, w, w_scale, _ = fp8_case(2, 5, 16, "cpu", seed=12)
    with pytest.raises(ValueError, match="out_dtype must be one of"):
        gemv_fp8(a, a_scale, w, w_scale, out_dtype=FP8)
    x, wb, _ = bf16_case(2, 5, 16, DEVICE, seed=13)
    for config, message in [
        (GemvConfig(block_n=6, block_k=32), "block_n must be a positive power of two"),
        (GemvConfig(block_n=8, block_k=32, split_k=0), "split_k and num_stages must be >= 1"),
        (GemvConfig(block_n=8, block_k=32, use_dot=True), "use_dot needs block_n"),
    ]:
        with pytest.raises(ValueError, match=message):
            gemv(x, wb, config=config)


def test_default_config_fills_the_gpu():
    for m, n, k in [(1, 2304, 4096), (16, 1024, 2304), (1, 163840, 2304)]:
        config = gemv_cfg.default_config(m, n, k, 2)
        config.check()
        if not config.use_dot:
            step = gemv_cfg._STEP_ELEMENTS[m] * gemv_cfg._TILE_CHANNELS
            assert config.block_k * config.block_n <= step
        assert config.split_k == 1 or k >= 2 * config.split_k * config.block_k


def test_n_blocks_fit_the_grids_second_axis():
    # The LM head (163840 channels) in 2-channel blocks would need 81920 of them.
    lm_head = gemv_cfg.default_config(1, 163840, 2304, 2)
    assert -(-163840 // lm_head.block_n) <= 65535
    fp32 = gemv_cfg.default_config(1, 163840, 2304, 4)
    assert not fp32.use_dot and -(-163840 // fp32.block_n) <= 65535
    # The wide tile's 16 channels too (a 16M weight of K 8: 131072 blocks of 16).
    wide = gemv_cfg.default_config(1, 2**21, 8, 2)
    assert wide.block_k == gemv_cfg.WIDE_TILE.block_k and -(-(2**21) // wide.block_n) <= 65535
    x = torch.zeros(1, 16, dtype=torch.bfloat16)
    w = torch.zeros(65536, 16, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="65536 N blocks"):
        gemv(x, w, config=GemvConfig(block_n=1, block_k=16))


def test_default_multiply_and_sum_steps_by_rows():
    # o_proj (K 4096) at M = 1: the whole K in one step of two channels, at M = 2 two steps,
    # for FP8 and bf16 weights alike; one pipeline stage. Small K: one step of its padded size.
    for m, block_k in ((1, 4096), (2, 2048)):
        for weight_bytes in (1, 2):
            config = gemv_cfg.default_config(m, 2304, 4096, weight_bytes)
            assert (config.block_n, config.block_k, config.num_stages) == (2, block_k, 1)
            assert not config.use_dot
    assert gemv_cfg.default_config(1, 2304, 200, 2).block_k == 256
    # Wider channel blocks (the grid's limit) keep the step's elements.
    wide = gemv_cfg.default_config(1, 163840, 4096, 2)
    assert wide.block_n * wide.block_k == 2 * 4096


def is_wide(config: GemvConfig) -> bool:
    return replace(config, split_k=gemv_cfg.WIDE_TILE.split_k) == gemv_cfg.WIDE_TILE


def test_wide_tile_at_one_bf16_row_of_a_wide_weight():
    # KDA's fused input projection (12576 x 2304) at one row: WIDE_TILE, one stage, no split.
    config = gemv_cfg.default_config(1, 12576, 2304, 2)
    assert is_wide(config)
    assert (config.num_stages, config.split_k, config.use_dot) == (1, 1, False)
    # From WIDE_TILE_MIN_N channels on, up to the one-row weight bound (32M elements at K 2048).
    widest = gemv_cfg.BF16_GEMV_M1_MAX_WEIGHT_NUMEL // 2048
    assert is_wide(gemv_cfg.default_config(1, gemv_cfg.WIDE_TILE_MIN_N, 2304, 2))
    assert is_wide(gemv_cfg.default_config(1, widest, 2048, 2))
    for m, n, k, weight_bytes in [
        (1, gemv_cfg.WIDE_TILE_MIN_N - 1, 2304, 2),  # fewer channels: the default tiles
        (1, widest + 1, 2048, 2),  # past the one-row bound
        (2, 12576, 2304, 2),  # two rows
        (1, 12576, 2304, 1),  # FP8
        (1, 163840, 2304, 2),  # the LM head
        (1, 8192, 512, 2),  # MLA's kv_b: under the 12M bound, keeps the tiles it was timed in
        (1, 8192, 2305, 2),  # K past BF16_GEMV_M1_MAX_K
    ]:
        assert not is_wide(gemv_cfg.default_config(m, n, k, weight_bytes)), (m, n, k)


# ---------------------------------------------------------------------------------------------
# Dispatch from the layers
# ---------------------------------------------------------------------------------------------


def bf16_layer(k: int, n: int, device: str, bias: bool = True) -> ReplicatedLinear:
    layer = ReplicatedLinear(k, n, bias=bias, params_dtype=torch.bfloat16)
    _, w, b = bf16_case(1, n, k, "cpu", seed=14, bias=True)
    layer.weight_loader(layer.weight, w)
    if bias:
        layer.weight_loader(layer.bias, b)
    return layer.to(device)


def test_cpu_layer_uses_f_linear(triton_launches):
    layer = bf16_layer(64, 24, "cpu")
    x = bf16_case(3, 1, 64, "cpu", seed=15)[0].reshape(3, 1, 64)
    out = layer(x)[0]
    assert torch.equal(out, torch.nn.functional.linear(x, layer.weight, layer.bias))
    assert triton_launches["_gemv_kernel"] == 0
    assert not gemv_cfg.use_bf16_gemv(x, layer.weight)


def rowwise_kernel(w: torch.Tensor) -> RowWiseTorchFP8ScaledMMLinearKernel:
    config = FP8ScaledMMLinearLayerConfig(
        kFp8DynamicTokenSym, kFp8StaticChannelSym, tuple(w.shape), torch.bfloat16, torch.bfloat16
    )
    return RowWiseTorchFP8ScaledMMLinearKernel(config)


def test_cpu_rowwise_fp8_kernel_uses_the_reference(triton_launches):
    a, a_scale, w, w_scale, _ = fp8_case(2, 16, 32, "cpu", seed=16)
    out = rowwise_kernel(w).apply_scaled_mm(a, w.t(), torch.bfloat16, a_scale, w_scale, None)
    assert torch.equal(out, dequantized_matmul(a, w.t(), torch.bfloat16, a_scale, w_scale, None))
    assert triton_launches["_gemv_kernel"] == 0


# Kimi-Linear's decode linears by weight size, at one row: o_proj (2304 x 4096, 9.4M elements)
# and MLA's merged q | kv_a projection (6720 x 2304, 15.5M) take the GEMV in bf16 and FP8; the
# KDA in_proj (12576 x 2304, 29M) the GEMV in bf16 and the vendor GEMM in FP8; the dense first
# layer's down (2304 x 9216, 21M: K past BF16_GEMV_M1_MAX_K, not timed on the GEMV) and gate / up
# (18432 x 2304, 42M) the vendor GEMM in both. Then the one-row bounds' edges: exactly 32M
# elements (K 2048) and one row more; K 2305 (13.8M: the FP8 GEMV's 16M admits it); Kimi-K3's
# latent-MoE up projection (7168 x 3584, 25.7M).
WEIGHT_SIZES = [((2304, 4096), True, True), ((6720, 2304), True, True),
                ((12576, 2304), True, False), ((2304, 9216), False, False),
                ((18432, 2304), False, False), ((16384, 2048), True, False),
                ((16385, 2048), False, False), ((6000, 2305), False, True),
                ((7168, 3584), False, False)]  # fmt: skip


@pytest.mark.parametrize(("shape", "bf16", "fp8"), WEIGHT_SIZES)
def test_fp8_dispatch_by_weight_size(shape, bf16, fp8):
    assert gemv_cfg.use_fp8_gemv(1, torch.empty(shape, device="meta")) == fp8


@pytest.mark.parametrize(("shape", "bf16", "fp8"), WEIGHT_SIZES)
def test_bf16_weight_bound_by_rows(shape, bf16, fp8):
    # The size test of use_bf16_gemv (the rest needs a GPU): at two rows only o_proj's size.
    numel, k = shape[0] * shape[1], shape[1]
    assert gemv_cfg.bf16_gemv_weight_fits(1, numel, k) == bf16
    small = numel <= gemv_cfg.BF16_GEMV_MAX_WEIGHT_NUMEL
    assert gemv_cfg.bf16_gemv_weight_fits(2, numel, k) == small


@pytest.mark.gpu
@pytest.mark.parametrize(("shape", "bf16", "fp8"), WEIGHT_SIZES)
def test_gpu_bf16_dispatch_by_weight_size(shape, bf16, fp8):
    w = torch.empty(shape, dtype=torch.bfloat16, device="cuda")
    x = torch.zeros(1, 1, shape[1], dtype=torch.bfloat16, device="cuda")
    assert gemv_cfg.use_bf16_gemv(x, w) == bf16
    # At two rows (in any leading dims) only weights of up to BF16_GEMV_MAX_WEIGHT_NUMEL elements.
    small = w.numel() <= gemv_cfg.BF16_GEMV_MAX_WEIGHT_NUMEL
    for rows in ((2, shape[1]), (1, 2, shape[1])):
        x = torch.zeros(rows, dtype=torch.bfloat16, device="cuda")
        assert gemv_cfg.use_bf16_gemv(x, w) == small


@pytest.mark.gpu
@pytest.mark.parametrize("m", [1, gemv_cfg.BF16_GEMV_MAX_M, gemv_cfg.BF16_GEMV_MAX_M + 1])
def test_gpu_bf16_layer_dispatch_by_m(triton_launches, m):
    layer = bf16_layer(256, 96, "cuda")
    x = bf16_case(m, 1, 256, "cuda", seed=17)[0].reshape(m, 1, 256)
    out = layer(x)[0]
    assert out.shape == (m, 1, 96)
    assert triton_launches["_gemv_kernel"] == (m <= gemv_cfg.BF16_GEMV_MAX_M)
    assert_within_bound(out.reshape(m, 96), x.reshape(m, 256), layer.weight, layer.bias)


@pytest.mark.gpu
@pytest.mark.parametrize(
    "m", [1, gemv_cfg.FP8_GEMV_MAX_M + 1, gemv_cfg.FP8_DOT_MAX_M, gemv_cfg.FP8_DOT_MAX_M + 1]
)
def test_gpu_rowwise_fp8_dispatch_by_m(triton_launches, preloads, m):
    if not RowWiseTorchFP8ScaledMMLinearKernel.is_supported()[0]:
        pytest.skip("rowwise _scaled_mm needs sm_89+")
    a, a_scale, w, w_scale, _ = fp8_case(m, 256, 512, "cuda", seed=18)
    out = rowwise_kernel(w).apply_scaled_mm(a, w.t(), torch.bfloat16, a_scale, w_scale, None)
    triton_max = max(gemv_cfg.FP8_GEMV_MAX_M, gemv_cfg.FP8_DOT_MAX_M)
    assert triton_launches["_gemv_kernel"] == (m <= triton_max)
    # The layer's weight, static: preloaded where the launch is multiply-and-sum.
    assert preloads == [m <= gemv_cfg.FP8_GEMV_MAX_M] * (m <= triton_max)
    if m <= triton_max:
        assert_within_bound(out, a, w, None, a_scale, w_scale)
    else:  # the vendor GEMM, exactly (its accumulation is cuBLASLt's, not the GEMV's bound)
        vendor = torch._scaled_mm(
            a, w.t(), scale_a=a_scale, scale_b=w_scale.reshape(1, -1), out_dtype=torch.bfloat16
        )
        torch.testing.assert_close(out, vendor, rtol=0, atol=0)


# ---------------------------------------------------------------------------------------------
# Static weights (gemv.py): a one-step split's tile loaded before the PDL wait, the same sums
# ---------------------------------------------------------------------------------------------


@pytest.fixture
def preloads(launch_constexprs) -> list[bool]:
    """``PRELOAD`` of each `_gemv_kernel` launch during the test, in order."""
    return launch_constexprs(gemv_op, "PRELOAD")


# The interpreter configs, four steps over K with a tail (200 = 3 x 64 + 8) and four splits of
# one step each (the last one short). The default (one and two rows), the wide tile and
# "one_step_splits" take each split's K in one step, "split" and "steps" in several.
STATIC_CONFIGS = dict(
    CPU_CONFIGS,
    steps=GemvConfig(block_n=8, block_k=64),
    one_step_splits=GemvConfig(block_n=8, block_k=64, split_k=4),
)


@pytest.mark.parametrize("config", list(STATIC_CONFIGS))
@pytest.mark.parametrize("m", [1, 2])
def test_static_weight_sums_bit_for_bit(triton_launches, preloads, config, m):
    cfg = STATIC_CONFIGS[config]
    x, w, b = bf16_case(m, 37, 200, DEVICE, seed=70 + m)
    a, a_scale, wq, w_scale, fp8_bias = fp8_case(m, 37, 200, DEVICE, seed=72 + m, bias=True)
    outs = [
        (gemv(x, w, b, config=cfg, static_weight=static),
         gemv_fp8(a, a_scale, wq, w_scale, fp8_bias, config=cfg, static_weight=static))
        for static in (False, True)
    ]  # fmt: skip
    assert torch.equal(outs[0][0], outs[1][0]) and torch.equal(outs[0][1], outs[1][1])
    assert_within_bound(outs[1][0], x, w, b)
    # Multiply-and-sum splits of one step preload; tl.dot and several steps keep their form.
    preload = config in ("default", "wide", "one_step_splits")
    assert preloads == [False] * 2 + [preload] * 2


def test_bf16_layers_launch_plainly(monkeypatch, triton_launches, preloads):
    """`UnquantizedLinearMethod` hands `gemv` its weight without the early loads, measured slower
    for the bf16 GEMVs (gemv.py, "Static weights"; the GPU's dispatch faked on CPU rows)."""
    monkeypatch.setattr(gemv_cfg, "use_bf16_gemv", lambda x, w: True)
    layer = bf16_layer(64, 24, DEVICE)
    x = bf16_case(1, 1, 64, DEVICE, seed=76)[0]
    out = layer(x)[0]
    assert_within_bound(out, x, layer.weight, layer.bias)
    assert preloads == [False]


# ---------------------------------------------------------------------------------------------
# GPU: Kimi-Linear shapes, every kernel variant, CUDA graphs
# ---------------------------------------------------------------------------------------------

# (K, N): o_proj, q/k/v-sized, shared-expert down and gate/up, LM head.
KIMI_SHAPES = [(4096, 2304), (2304, 12448), (2304, 1024), (1024, 2304), (2304, 163840)]
GPU_CONFIGS = [
    None,
    GemvConfig(block_n=8, block_k=256, split_k=4, num_stages=1),
    GemvConfig(block_n=16, block_k=256, use_dot=True, num_stages=3),
    GemvConfig(block_n=64, block_k=128, num_warps=4, use_dot=True, num_stages=3),
    GemvConfig(128, 128, split_k=None, use_dot=True, num_stages=4, fp8_mma=True),
]


@pytest.mark.gpu
@pytest.mark.parametrize("m", [1, 4, 16])
@pytest.mark.parametrize("shape", KIMI_SHAPES, ids=lambda s: f"{s[0]}to{s[1]}")
def test_gpu_bf16_kimi_shapes(m, shape):
    k, n = shape
    x, w, b = bf16_case(m, n, k, "cuda", seed=m + k, bias=m == 4)
    assert_within_bound(gemv(x, w, b), x, w, b)


@pytest.mark.gpu
@pytest.mark.parametrize("m", [1, 4, 16])
@pytest.mark.parametrize("shape", KIMI_SHAPES[:4], ids=lambda s: f"{s[0]}to{s[1]}")
def test_gpu_fp8_kimi_shapes(m, shape):
    k, n = shape
    a, a_scale, w, w_scale, b = fp8_case(m, n, k, "cuda", seed=m + n, bias=m == 4)
    assert_within_bound(gemv_fp8(a, a_scale, w, w_scale, b), a, w, b, a_scale, w_scale)


@pytest.mark.gpu
@pytest.mark.parametrize("config", range(len(GPU_CONFIGS)))
@pytest.mark.parametrize("m", [1, 5, 16])
def test_gpu_every_variant_compiles_and_is_exact(m, config):
    # o_proj (4096 -> 2304) in FP8 and bf16 at each variant of the benchmark's sweep.
    cfg = GPU_CONFIGS[config]
    a, a_scale, w, w_scale, _ = fp8_case(m, 2304, 4096, "cuda", seed=m)
    assert_within_bound(gemv_fp8(a, a_scale, w, w_scale, config=cfg), a, w, None, a_scale, w_scale)
    x, wb, b = bf16_case(m, 2304, 4096, "cuda", seed=m)
    assert_within_bound(gemv(x, wb, b, config=cfg), x, wb, b)


# The tl.dot path at o_proj size: the default config, then corners of the benchmark's
# --dot-sweep (BLOCK_N 64 / 128, BLOCK_K 128 / 256, rows per program 16..64, split-K 1..16 / auto,
# 4 / 8 warps, 3..5 stages), FP8 codes widened to bf16 or straight into the FP8 MMA.
DOT_GPU_CONFIGS = [
    None,
    GemvConfig(128, 128, split_k=None, use_dot=True, num_stages=4, fp8_mma=True),
    GemvConfig(128, 256, num_warps=8, split_k=None, use_dot=True, num_stages=2, block_m=64),
    GemvConfig(64, 128, split_k=1, use_dot=True, num_stages=5, block_m=16, fp8_mma=True),
    GemvConfig(64, 256, num_warps=8, split_k=8, use_dot=True, num_stages=3, block_m=32),
]


@pytest.mark.gpu
@pytest.mark.parametrize("config", range(len(DOT_GPU_CONFIGS)))
@pytest.mark.parametrize("m", [5, 8, 17, 64, 256])
def test_gpu_dot_o_proj(m, config):
    cfg = DOT_GPU_CONFIGS[config]
    a, a_scale, w, w_scale, b = fp8_case(m, 2304, 4096, "cuda", seed=70 + m, bias=m == 17)
    out = gemv_fp8(a, a_scale, w, w_scale, b, config=cfg)
    assert_within_bound(out, a, w, b, a_scale, w_scale)
    x, wb, b = bf16_case(m, 2304, 4096, "cuda", seed=80 + m, bias=m != 17)
    assert_within_bound(gemv(x, wb, b, config=cfg), x, wb, b)
    if cfg is None:
        assert gemv_cfg.default_config(m, 2304, 4096, 1).use_dot


@pytest.mark.gpu
@pytest.mark.parametrize("m", [8, 64])
def test_gpu_fp8_mma_exact_on_small_integer_codes(m):
    # Codes in [-4, 4] and power-of-two scales: every product and every partial sum is an exact
    # small integer (|sum| <= 16 * 4096), whatever the FP8 MMA's accumulation precision, so the
    # default FP8 tl.dot path must equal the exact reference bit for bit at o_proj size.
    gen = torch.Generator(device="cuda").manual_seed(m)
    a = torch.randint(-4, 5, (m, 4096), generator=gen, device="cuda").to(FP8)
    w = torch.randint(-4, 5, (2304, 4096), generator=gen, device="cuda").to(FP8)
    a_scale = torch.full((m, 1), 0.5, device="cuda")
    w_scale = 2.0 ** torch.randint(-3, 1, (2304, 1), generator=gen, device="cuda").float()
    assert gemv_cfg.default_config(m, 2304, 4096, 1).fp8_mma
    out = gemv_fp8(a, a_scale, w, w_scale)
    exact = (a.double() @ w.double().t()) * a_scale.double() * w_scale.double().t()
    torch.testing.assert_close(out, exact.to(torch.bfloat16), rtol=0, atol=0)


@pytest.mark.gpu
@pytest.mark.parametrize("m", [gemv_cfg.FP8_GEMV_MAX_M + 1, 64, 65])
def test_gpu_rowwise_fp8_dot_dispatch(monkeypatch, triton_launches, m):
    # With FP8_DOT_MAX_M = 64 the rows above the GEMV's up to 64 take the tl.dot path.
    if not RowWiseTorchFP8ScaledMMLinearKernel.is_supported()[0]:
        pytest.skip("rowwise _scaled_mm needs sm_89+")
    monkeypatch.setattr(gemv_cfg, "FP8_DOT_MAX_M", 64)
    a, a_scale, w, w_scale, _ = fp8_case(m, 256, 512, "cuda", seed=90)
    out = rowwise_kernel(w).apply_scaled_mm(a, w.t(), torch.bfloat16, a_scale, w_scale, None)
    assert triton_launches["_gemv_kernel"] == (m <= 64)
    assert_within_bound(out, a, w, None, a_scale, w_scale)


@pytest.mark.gpu
@pytest.mark.parametrize("m", [gemv_cfg.BF16_GEMV_MAX_M + 1, 32, 33])
def test_gpu_bf16_dot_dispatch(monkeypatch, triton_launches, m):
    monkeypatch.setattr(gemv_cfg, "BF16_DOT_MAX_M", 32)
    layer = bf16_layer(256, 96, "cuda")
    x = bf16_case(m, 1, 256, "cuda", seed=91)[0].reshape(m, 1, 256)
    out = layer(x)[0]
    assert triton_launches["_gemv_kernel"] == (m <= 32)
    assert_within_bound(out.reshape(m, 96), x.reshape(m, 256), layer.weight, layer.bias)


@pytest.mark.gpu
@pytest.mark.parametrize("config", [0, 1, 4])
def test_gpu_cuda_graph_replay_equals_eager(config):
    cfg = GPU_CONFIGS[config]
    x, w, b = bf16_case(4, 2304, 4096, "cuda", seed=19)
    a, a_scale, wq, w_scale, _ = fp8_case(4, 2304, 4096, "cuda", seed=20)

    def step():
        return gemv(x, w, b, config=cfg), gemv_fp8(a, a_scale, wq, w_scale, config=cfg)

    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        step()  # compile outside the capture
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = step()
    # New inputs in the captured buffers: the replay must read them, not the capture's values.
    gen = torch.Generator(device="cuda").manual_seed(21)
    x.copy_(torch.randn(x.shape, generator=gen, device="cuda"))
    a.copy_(fp8_case(4, 1, 4096, "cuda", seed=22)[0])
    eager = step()
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(captured[0], eager[0])  # deterministic: bit for bit
    assert torch.equal(captured[1], eager[1])


@pytest.mark.gpu
def test_gpu_static_weight_reads_rows_the_kernel_before_writes(preloads):
    """A graph of the layers' one-row chains: a PDL kernel (the norm, the per-token quantization)
    writes the row just before each static-weight GEMV at o_proj's shape, whose weight loads may
    then run ahead of the wait. Every replay on new inputs reads the new rows: bit for bit the
    eager chain."""
    x = bf16_case(1, 1, 4096, "cuda", seed=23)[0]
    w = bf16_case(1, 2304, 4096, "cuda", seed=24)[1]
    wq, w_scale = fp8_case(1, 2304, 4096, "cuda", seed=25)[2:4]
    norm_w = torch.ones(4096, dtype=torch.bfloat16, device="cuda")

    def step():
        # Each GEMV right after the launch that writes its rows.
        h = rms_norm(x, norm_w, 1e-6)
        out = gemv(h, w, static_weight=True)
        a, a_scale = per_token_fp8_quant(h)
        return out, gemv_fp8(a, a_scale, wq, w_scale, static_weight=True)

    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        step()  # compile outside the capture
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = step()
    assert preloads and all(preloads)
    gen = torch.Generator(device="cuda").manual_seed(26)
    for _ in range(20):
        x.copy_(torch.randn(x.shape, generator=gen, device="cuda"))
        graph.replay()
        eager = step()
        torch.cuda.synchronize()
        assert torch.equal(captured[0], eager[0]) and torch.equal(captured[1], eager[1])


# ---------------------------------------------------------------------------------------------
# Batched: one weight per batch (MLA's absorbed per-head W_UK / W_UV)
# ---------------------------------------------------------------------------------------------


def batched_case(batch: int, m: int, n: int, k: int, device: str, seed: int):
    """x as the transposed view MLA passes (`[h, Nd, in]` of `[Nd, h, in]` rows, wider than K),
    weight `[B, N, K]` contiguous."""
    gen = torch.Generator(device=device).manual_seed(seed)
    rows = torch.randn(m, batch, k + 8, generator=gen, device=device).to(torch.bfloat16)
    w = (torch.randn(batch, n, k, generator=gen, device=device) * k**-0.5).to(torch.bfloat16)
    return rows[..., :k].transpose(0, 1), w


def assert_batched_within_bound(out, x, w):
    for b in range(x.shape[0]):
        assert_within_bound(out[b], x[b], w[b])


# Interpreter configs: the default, tails in N and K, one warp with 4-channel blocks.
BATCHED_CONFIGS = {
    "default": None,
    "tails": GemvConfig(block_n=8, block_k=32, num_stages=1),
    "narrow": GemvConfig(block_n=4, block_k=64, num_warps=1, num_stages=1),
}


@pytest.mark.parametrize("config", list(BATCHED_CONFIGS))
@pytest.mark.parametrize("m", [1, 3, 17])
def test_batched_gemv_matches_exact_per_batch(triton_launches, config, m):
    # 17 rows: two M blocks. Into a fresh tensor and through `out`, a transposed view.
    x, w = batched_case(3, m, 20, 40, DEVICE, seed=40 + m)
    out = gemv_batched(x, w, config=BATCHED_CONFIGS[config])
    assert out.shape == (3, m, 20) and out.dtype == torch.bfloat16
    assert_batched_within_bound(out, x, w)
    rows = torch.full((m, 3, 20), float("nan"), dtype=torch.bfloat16, device=DEVICE)
    written = gemv_batched(x, w, out=rows.transpose(0, 1), config=BATCHED_CONFIGS[config])
    assert written.data_ptr() == rows.data_ptr()
    assert torch.equal(rows.transpose(0, 1), out)
    assert triton_launches["_gemv_kernel"] == 2
    assert triton_launches["_gemv_split_reduce_kernel"] == 0


@pytest.mark.parametrize("config", ["default", "tails"])
def test_static_batched_weight_sums_bit_for_bit(triton_launches, preloads, config):
    cfg = BATCHED_CONFIGS[config]
    x, w = batched_case(3, 1, 20, 40, DEVICE, seed=74)
    plain = gemv_batched(x, w, config=cfg)
    assert torch.equal(gemv_batched(x, w, config=cfg, static_weight=True), plain)
    # K 40: one 64-wide step by default, two of 32 in "tails".
    assert preloads == [False, config == "default"]


def test_batched_cpu_without_interpreter_and_empty(monkeypatch, triton_launches):
    x, w = batched_case(2, 3, 12, 40, "cpu", seed=50)
    assert torch.equal(gemv_batched(x[:, :0], w).reshape(-1), torch.empty(0))
    no_k = torch.full((2, 3, 12), 1.0, dtype=torch.bfloat16)
    assert not gemv_batched(x[..., :0], w[..., :0], out=no_k).any()  # K = 0: the empty sum
    assert triton_launches["_gemv_kernel"] == 0
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    out = torch.empty(3, 2, 12, dtype=torch.bfloat16).transpose(0, 1)
    assert torch.equal(gemv_batched(x, w, out=out), gemv_batched_ref(x, w))
    assert torch.equal(out, gemv_batched_ref(x, w))
    assert triton_launches["_gemv_kernel"] == 0


@pytest.mark.parametrize(
    "change,message",
    [
        (lambda x, w, o: (x[0], w, o), r"x must be \[B, M, K\]"),
        (lambda x, w, o: (x, w[:1], o), r"x must be \[B, M, K\]"),
        (lambda x, w, o: (x, w[..., :8], o), "x and weight must share K"),
        (lambda x, w, o: (x.float(), w.float(), o), "share one dtype"),
        (lambda x, w, o: (x, w.mT.contiguous().mT, o), "unit stride"),
        (lambda x, w, o: (x, w, o[:, :2]), r"out must be torch.bfloat16 \(2, 3, 12\)"),
        (lambda x, w, o: (x, w, o.half()), "out must be torch.bfloat16"),
        (lambda x, w, o: (x, w, o.mT.contiguous().mT), "unit stride on N"),
    ],
)
def test_batched_argument_errors(change, message):
    x, w = batched_case(2, 3, 12, 16, "cpu", seed=51)
    out = torch.empty(2, 3, 12, dtype=torch.bfloat16)
    x, w, out = change(x, w, out)
    with pytest.raises(ValueError, match=message):
        gemv_batched(x, w, out=out)


def test_batched_config_errors(triton_launches):
    x, w = batched_case(2, 1, 12, 16, DEVICE, seed=52)
    for config, message in [
        (GemvConfig(block_n=8, block_k=32, split_k=2), "without K splits"),
        (GemvConfig(block_n=16, block_k=32, use_dot=True), "without K splits"),
        (GemvConfig(block_n=6, block_k=32), "block_n must be a positive power of two"),
    ]:
        with pytest.raises(ValueError, match=message):
            gemv_batched(x, w, config=config)
    assert triton_launches["_gemv_kernel"] == 0


def test_batched_default_config_fills_the_h200(monkeypatch):
    # One step over the whole K, channels halved until 132 SMs hold two programs each.
    monkeypatch.setattr(gemv_cfg, "num_sms", lambda: 132)
    gemv_cfg.batched_config.cache_clear()
    try:
        uk = gemv_cfg.batched_config(32, 1, 512, 128)  # W_UK: [32, 512, 128]
        uv = gemv_cfg.batched_config(32, 1, 128, 512)  # W_UV: [32, 128, 512]
        few = gemv_cfg.batched_config(1, 1, 4, 64)
        rows = gemv_cfg.batched_config(32, 8, 128, 512)
        m_blocks = gemv_cfg.batched_config(4, 32, 512, 128)  # two M blocks count as programs
        monkeypatch.setattr(gemv_cfg, "num_sms", lambda: 128)
        gemv_cfg.batched_config.cache_clear()
        exact = gemv_cfg.batched_config(32, 1, 512, 128)  # 256 programs: two per SM already
    finally:
        gemv_cfg.batched_config.cache_clear()
    assert m_blocks.block_n == 8 and exact.block_n == 64
    assert (uk.block_n, uk.block_k, uk.split_k, uk.use_dot, uk.num_stages) == (32, 128, 1, False, 1)
    assert (uv.block_n, uv.block_k) == (8, 512)
    assert (few.block_n, few.block_k) == (2, 64)
    assert (rows.block_n, rows.block_k) == (8, 512)  # 4096-weight steps above one row


def test_batched_grid_limit(monkeypatch):
    x, w = batched_case(2, 1, 12, 16, "cpu", seed=54)
    monkeypatch.setattr(gemv_op, "MAX_GRID_Y", 2)
    with pytest.raises(ValueError, match="CUDA's second and third axes hold 2"):
        gemv_batched(x, w, config=GemvConfig(block_n=2, block_k=16, num_stages=1))


def test_batched_dispatch(monkeypatch):
    x, w = batched_case(2, gemv_cfg.BATCHED_GEMV_MAX_M, 12, 16, "cpu", seed=53)
    assert not gemv_cfg.use_batched_gemv(x, w)  # not on a GPU
    monkeypatch.setattr(gemv_cfg.current_platform, "is_cuda", lambda: True)
    monkeypatch.setattr(torch.Tensor, "is_cuda", property(lambda self: True))
    assert gemv_cfg.use_batched_gemv(x, w)
    big = x.new_zeros(2, gemv_cfg.BATCHED_GEMV_MAX_M + 1, 16)
    assert gemv_cfg.use_batched_gemv(big[:, :-1], w)
    assert not gemv_cfg.use_batched_gemv(big, w)
    assert not gemv_cfg.use_batched_gemv(x.float(), w.float())
    assert not gemv_cfg.use_batched_gemv(x, w.half())
    assert gemv_cfg.BATCHED_GEMV_MAX_M == 1  # two rows break Triton 3.6's load order
    assert not gemv_cfg.use_batched_gemv(x, w.mT.contiguous().mT)


@pytest.mark.gpu
@pytest.mark.parametrize("m", [1, 4, 8, 16])
@pytest.mark.parametrize("shape", [(512, 128), (128, 512)], ids=["w_uk", "w_uv"])
def test_gpu_batched_mla_absorb_shapes(m, shape):
    n, k = shape
    x, w = batched_case(32, m, n, k, "cuda", seed=m + n)
    assert_batched_within_bound(gemv_batched(x, w), x, w)
    out = torch.empty(m, 32, n, dtype=torch.bfloat16, device="cuda")
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        eager = gemv_batched(x, w)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        gemv_batched(x, w, out=out.transpose(0, 1))
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out.transpose(0, 1), eager)


# ---------------------------------------------------------------------------------------------
# fp32 weights (the router's gate): IEEE fp32 products, no TF32
# ---------------------------------------------------------------------------------------------

# Interpreter configs for fp32 weights: the default (multiply-and-sum at M <= 8, tl.dot above),
# split-K with a K tail, tl.dot with 32-row blocks. N 24 leaves a partial N block to the 16-wide
# ones.
FP32_CONFIGS = {
    "default": None,
    "split": GemvConfig(block_n=4, block_k=32, split_k=3),
    "dot_m32": GemvConfig(block_n=16, block_k=32, use_dot=True, block_m=32),
}
# The fp32 weight split into three bf16 terms for bf16 MMAs (bf16 x only), with a split K tail.
BF16X3 = GemvConfig(block_n=16, block_k=32, split_k=2, use_dot=True, bf16x3=True)


def assert_fp32_within_bound(out, x, w, terms_per_k=1):
    """fp32 products (one rounding each) summed in fp32 in any order: at most about
    (K + 1) * 2^-24 * sum_k |x_k w_k| off the exact fp64 sum; (K + 2) covers second-order terms.
    `terms_per_k` 3: bf16x3's 3 K exact products, (3 K + 2)."""
    xd, wd = x.double(), w.double()
    exact, size = xd @ wd.t(), xd.abs() @ wd.abs().t()
    err = (out.double() - exact).abs()
    assert out.dtype == torch.float32 and out.shape == exact.shape
    bound = (terms_per_k * x.shape[1] + 2) * 2**-24 * size
    assert (err <= bound).all(), f"max excess {(err - bound).max().item():.3g}"


@pytest.mark.parametrize("config", list(FP32_CONFIGS))
@pytest.mark.parametrize("m", [1, 3, 17])
@pytest.mark.parametrize("x_dtype", [torch.bfloat16, torch.float32])
def test_fp32_weight_gemv_matches_exact(triton_launches, config, m, x_dtype):
    gen = torch.Generator().manual_seed(30 + m)
    x = torch.randn(m, 300, generator=gen).to(x_dtype).to(DEVICE)
    w = (torch.randn(24, 300, generator=gen) * 300**-0.5).to(DEVICE)
    # The default takes bf16x3 for bf16 x above _FP32_BF16X3_MIN_M rows: 3 K products per sum.
    bf16x3 = config == "default" and x_dtype == torch.bfloat16 and m > gemv_cfg._FP32_BF16X3_MIN_M
    out = gemv_op.gemv_fp32(x, w, config=FP32_CONFIGS[config])
    assert_fp32_within_bound(out, x, w, terms_per_k=3 if bf16x3 else 1)
    assert triton_launches["_gemv_kernel"] == 1


@pytest.mark.parametrize("config", list(FP32_CONFIGS))
def test_fp32_weight_is_not_rounded(triton_launches, config):
    # One-hot rows of x: each logit is one product by a power of two, exact in fp32, so the
    # output must equal the weight's column bit for bit. TF32 / bf16 rounding of the weight (its
    # low mantissa bits are set here) would not.
    gen = torch.Generator().manual_seed(33)
    w = ((1 + torch.rand(24, 80, generator=gen)) * (1 + 2**-20)).to(DEVICE)
    cols = torch.tensor([0, 7, 79, 40, 1], device=DEVICE)
    x = torch.zeros(5, 80, dtype=torch.bfloat16, device=DEVICE)
    x[torch.arange(5), cols] = torch.tensor([1.0, -2.0, 0.5, 4.0, 1.0], dtype=torch.bfloat16)
    out = gemv_op.gemv_fp32(x, w, config=FP32_CONFIGS[config])
    assert torch.equal(out, w[:, cols].t() * x[torch.arange(5), cols].float()[:, None])
    assert triton_launches["_gemv_kernel"] == 1


@pytest.mark.parametrize("m", [3, 17])
def test_fp32_weight_bf16x3_matches_exact(triton_launches, m):
    gen = torch.Generator().manual_seed(40 + m)
    x = torch.randn(m, 300, generator=gen).to(torch.bfloat16).to(DEVICE)
    w = (torch.randn(24, 300, generator=gen) * 300**-0.5).to(DEVICE)
    assert_fp32_within_bound(gemv_op.gemv_fp32(x, w, config=BF16X3), x, w, terms_per_k=3)
    assert triton_launches["_gemv_kernel"] == 1


def test_fp32_weight_bf16x3_splits_the_weight_exactly(triton_launches):
    # One-hot rows of x: each logit is hi + mid + lo of one weight times a power of two. Weights
    # with all 24 significand bits set across many exponents come back bit for bit only if the
    # three bf16 terms sum to the weight exactly (two terms would lose its last 8 bits).
    gen = torch.Generator().manual_seed(34)
    w = (1 + torch.rand(24, 80, generator=gen)) * (1 + 2**-20)
    w = w * 2.0 ** torch.randint(-40, 40, (24, 80), generator=gen)
    w[3, :] = -w[3, :]
    w = w.to(DEVICE)
    cols = torch.tensor([0, 7, 79, 40, 1], device=DEVICE)
    x = torch.zeros(5, 80, dtype=torch.bfloat16, device=DEVICE)
    x[torch.arange(5), cols] = torch.tensor([1.0, -2.0, 0.5, 4.0, 1.0], dtype=torch.bfloat16)
    out = gemv_op.gemv_fp32(x, w, config=BF16X3)
    assert torch.equal(out, w[:, cols].t() * x[torch.arange(5), cols].float()[:, None])


def test_fp32_weight_errors_and_empty(triton_launches):
    x = torch.zeros(2, 8, dtype=torch.bfloat16, device=DEVICE)
    w = torch.zeros(4, 8, device=DEVICE)
    with pytest.raises(ValueError, match="weight torch.float32"):
        gemv_op.gemv_fp32(x, w.bfloat16())
    with pytest.raises(ValueError, match="x must be one of"):
        gemv_op.gemv_fp32(x.to(torch.int32), w)
    with pytest.raises(ValueError, match="use_dot needs block_m"):
        gemv_op.gemv_fp32(x, w, config=GemvConfig(16, 16, use_dot=True, block_m=8))
    with pytest.raises(ValueError, match="bf16x3 needs use_dot"):
        gemv_op.gemv_fp32(x, w, config=GemvConfig(16, 16, bf16x3=True))
    with pytest.raises(ValueError, match="needs bf16 x"):
        gemv_op.gemv_fp32(x.float(), w, config=BF16X3)
    assert gemv_op.gemv_fp32(x[:0], w).shape == (0, 4)
    assert torch.equal(gemv_op.gemv_fp32(x[:, :0], w[:, :0]), torch.zeros(2, 4, device=DEVICE))
    assert triton_launches["_gemv_kernel"] == 0


def test_fp32_default_config_for_the_router(monkeypatch):
    # Kimi's gate (256 x 2304 fp32) on the H200's 132 SMs: one launch of 128 programs at decode
    # sizes, tl.dot above 8 rows with >= 100 programs up to T = 256 (fp32 x), every config
    # launchable.
    monkeypatch.setattr(gemv_cfg, "num_sms", lambda: 132)
    gemv_cfg.default_config.cache_clear()
    try:
        configs = {m: gemv_cfg.default_config(m, 256, 2304, 4) for m in [1, 8, 9, 64, 256, 4096]}
        sizes = [1, 4, 5, 16, 17, 256, 257, 4096]
        bf16 = {m: gemv_cfg.default_config(m, 256, 2304, 4, True) for m in sizes}
        fp32_x = {m: gemv_cfg.default_config(m, 256, 2304, 4) for m in [1, 4]}
    finally:
        gemv_cfg.default_config.cache_clear()
    # bf16 x: bf16x3 above 4 rows; M blocks of 16 rows up to 16, 32 up to 256, then 64.
    for m, cfg in bf16.items():
        cfg.check()
        assert cfg.bf16x3 == cfg.use_dot == (m > gemv_cfg._FP32_BF16X3_MIN_M)
        assert m <= 4 or cfg.block_m == (16 if m <= 16 else 32 if m <= 256 else 64)
    assert bf16[1] == fp32_x[1] and bf16[4] == fp32_x[4]
    for m, cfg in configs.items():
        cfg.check()
        assert not cfg.bf16x3  # fp32 x: its products would not be exact in bf16 MMAs
        assert cfg.use_dot == (m > gemv_cfg._FP32_DOT_MIN_M)
        m_blocks = -(-m // (cfg.block_m or 16))
        programs = 256 // cfg.block_n * m_blocks * cfg.split_k
        assert programs >= 100 and (cfg.split_k == 1 or 2 * cfg.split_k * cfg.block_k <= 2304)
    assert configs[1].split_k == configs[8].split_k == 1


@pytest.mark.gpu
@pytest.mark.parametrize("m", [1, 8, 64, 256, 4096])
@pytest.mark.parametrize(
    "config",
    [
        None,
        GemvConfig(block_n=16, block_k=64, use_dot=True),
        GemvConfig(block_n=64, block_k=64, split_k=None, use_dot=True, bf16x3=True),
    ],
)
def test_gpu_fp32_weight_router_shape(m, config):
    gen = torch.Generator(device="cuda").manual_seed(m)
    x = torch.randn(m, 2304, generator=gen, device="cuda").to(torch.bfloat16)
    w = torch.randn(256, 2304, generator=gen, device="cuda") * 2304**-0.5
    out = gemv_op.gemv_fp32(x, w, config=config)
    assert_fp32_within_bound(out, x, w, terms_per_k=3 if config and config.bf16x3 else 1)
