"""ROCm PTPC FP8 GEMMs from AITER, the kernels upstream's KDA `o_proj` fusion targets.

Written to AITER's documented Python API (upstream-facts B.4); no AMD GPU is available to this
project, so these are tested on CPU against a fake `aiter` module (selection, weight layout and the
exact call), not run. `aiter` is imported lazily, never at module import.

All three consume a pre-quantized per-token activation (`kFp8DynamicTokenSym`) and, in order of
preference:
- `AiterHipbMMPerTokenFp8ScaledMMLinearKernel`: hipBLASLt with a preshuffled weight
  (`aiter.hipb_mm(..., bpreshuffle=True)`); opt-in with `VLLM_ROCM_USE_AITER_LINEAR_HIPBMM=1`.
- `AiterPreshuffledPerTokenFp8ScaledMMLinearKernel`: CK `gemm_a8w8_bpreshuffle` for (N, K) pairs
  in AITER's tuned bpreshuffle table.
- `AiterPerTokenFp8ScaledMMLinearKernel`: CK `gemm_a8w8_CK` for (N, K) pairs in AITER's tuned table.
"""

import csv
from functools import cache
from pathlib import Path

import torch

import vllm.platforms
from vllm import envs
from vllm.model_executor.kernels.linear.scaled_mm.ScaledMMLinearKernel import (
    FP8ScaledMMLinearKernel,
    FP8ScaledMMLinearLayerConfig,
    ptpc_mismatch,
)
from vllm.model_executor.layers.quantization.utils.quant_utils import (
    QuantKey,
    kFp8DynamicTokenSym,
)

# AITER's tuned-GEMM tables, under the package's configs/ folder: one row per (M, N, K, weight
# dtype `q_dtype_w`, as `str(torch dtype)`); the a8w8 table holds int8 GEMMs beside FP8 ones.
_TUNED_PER_TOKEN_CSV = "a8w8_tuned_gemm.csv"
_TUNED_BPRESHUFFLE_CSV = "a8w8_bpreshuffle_tuned_gemm.csv"


def _aiter():
    import aiter

    return aiter


@cache
def _tuned_shapes(csv_name: str, q_dtype_w: torch.dtype) -> frozenset[tuple[int, int]]:
    path = Path(_aiter().__file__).parent / "configs" / csv_name
    if not path.is_file():
        return frozenset()
    with path.open(newline="") as f:
        # A table without the dtype column matches no row, as upstream's lookup by it.
        return frozenset(
            (int(row["N"]), int(row["K"]))
            for row in csv.DictReader(f)
            if row.get("q_dtype_w") == str(q_dtype_w)
        )


def is_per_token_w8a8_gemm_tuned(n: int, k: int, q_dtype_w: torch.dtype) -> bool:
    """Whether AITER's CK per-token GEMM has a tuned kernel for (N, K) with `q_dtype_w` weights."""
    return (n, k) in _tuned_shapes(_TUNED_PER_TOKEN_CSV, q_dtype_w)


def is_shuffled_per_token_w8a8_gemm_tuned(n: int, k: int, q_dtype_w: torch.dtype) -> bool:
    """Whether AITER's CK preshuffled per-token GEMM has a tuned kernel for (N, K) with
    `q_dtype_w` weights."""
    return (n, k) in _tuned_shapes(_TUNED_BPRESHUFFLE_CSV, q_dtype_w)


def _aiter_linear_enabled() -> tuple[bool, str | None]:
    platform = vllm.platforms.current_platform
    if not platform.is_rocm():
        return False, "needs ROCm"
    if not (envs.VLLM_ROCM_USE_AITER and envs.VLLM_ROCM_USE_AITER_LINEAR):
        return False, "needs VLLM_ROCM_USE_AITER=1 and VLLM_ROCM_USE_AITER_LINEAR=1"
    if not platform.has_aiter():
        return False, "aiter is not installed"
    return True, None


def _check_ptpc(config: FP8ScaledMMLinearLayerConfig, bf16_only: bool) -> str | None:
    reason = ptpc_mismatch(config)
    if reason is None and bf16_only and config.out_dtype not in (None, torch.bfloat16):
        return "produces bf16 only"
    return reason


class _AiterPtpcKernel(FP8ScaledMMLinearKernel):
    # A constant key: upstream's note on #54248 is why it is not derived from padding state.
    def input_quant_key(self) -> QuantKey | None:
        return kFp8DynamicTokenSym

    @classmethod
    def is_supported(cls) -> tuple[bool, str | None]:
        return _aiter_linear_enabled()


class AiterHipbMMPerTokenFp8ScaledMMLinearKernel(_AiterPtpcKernel):
    @classmethod
    def is_supported(cls) -> tuple[bool, str | None]:
        ok, reason = _aiter_linear_enabled()
        if not ok:
            return ok, reason
        if not envs.VLLM_ROCM_USE_AITER_LINEAR_HIPBMM:
            return False, "needs VLLM_ROCM_USE_AITER_LINEAR_HIPBMM=1"
        if not vllm.platforms.current_platform.on_mi3xx():
            return False, "needs CDNA3 or newer"
        if not hasattr(_aiter(), "hipb_mm"):
            return False, "aiter has no hipb_mm"
        return True, None

    @classmethod
    def can_implement(cls, config: FP8ScaledMMLinearLayerConfig) -> tuple[bool, str | None]:
        reason = _check_ptpc(config, bf16_only=True)
        n, k = config.weight_shape
        if reason is None and (n < 16 or n % 16 or k % 16):
            reason = f"needs N >= 16 and N, K multiples of 16, got N={n} K={k}"
        return reason is None, reason

    def process_weights_after_loading(self, layer: torch.nn.Module) -> None:
        from aiter.ops.shuffle import shuffle_weight

        shuffled = shuffle_weight(layer.weight.t().contiguous())  # [N, K], preshuffled
        layer.weight = torch.nn.Parameter(shuffled.t(), requires_grad=False)  # [K, N] view
        layer.weight_scale = torch.nn.Parameter(
            layer.weight_scale.t().contiguous(), requires_grad=False
        )  # [1, N]

    def apply_scaled_mm(self, a, b, out_dtype, a_scale, b_scale, bias):
        return _aiter().hipb_mm(
            a, b, solution_index=-1, bias=bias, out_dtype=out_dtype,
            scaleA=a_scale, scaleB=b_scale, scaleOut=None, bpreshuffle=True,
        )  # fmt: skip


class AiterPreshuffledPerTokenFp8ScaledMMLinearKernel(_AiterPtpcKernel):
    @classmethod
    def can_implement(cls, config: FP8ScaledMMLinearLayerConfig) -> tuple[bool, str | None]:
        reason = _check_ptpc(config, bf16_only=True)
        n, k = config.weight_shape
        if reason is None and (n % 16 or k % 16):
            reason = f"needs N, K multiples of 16, got N={n} K={k}"
        fp8 = vllm.platforms.current_platform.fp8_dtype()
        if reason is None and not is_shuffled_per_token_w8a8_gemm_tuned(n, k, fp8):
            reason = f"no tuned bpreshuffle GEMM for N={n} K={k} {fp8} weights"
        return reason is None, reason

    def process_weights_after_loading(self, layer: torch.nn.Module) -> None:
        from aiter.ops.shuffle import shuffle_weight

        shuffled = shuffle_weight(layer.weight.t().contiguous())  # [N, K]
        layer.weight = torch.nn.Parameter(shuffled, requires_grad=False)

    def apply_scaled_mm(self, a, b, out_dtype, a_scale, b_scale, bias):
        out = _aiter().gemm_a8w8_bpreshuffle(a, b, a_scale, b_scale, None, out_dtype)
        return out if bias is None else out + bias


class AiterPerTokenFp8ScaledMMLinearKernel(_AiterPtpcKernel):
    @classmethod
    def can_implement(cls, config: FP8ScaledMMLinearLayerConfig) -> tuple[bool, str | None]:
        reason = _check_ptpc(config, bf16_only=False)
        n, k = config.weight_shape
        fp8 = vllm.platforms.current_platform.fp8_dtype()
        if reason is None and not is_per_token_w8a8_gemm_tuned(n, k, fp8):
            reason = f"no tuned per-token GEMM for N={n} K={k} {fp8} weights"
        return reason is None, reason

    def process_weights_after_loading(self, layer: torch.nn.Module) -> None:
        layer.weight = torch.nn.Parameter(layer.weight.t(), requires_grad=False)  # [N, K]

    def apply_scaled_mm(self, a, b, out_dtype, a_scale, b_scale, bias):
        return _aiter().gemm_a8w8_CK(a, b, a_scale, b_scale, bias, out_dtype)
