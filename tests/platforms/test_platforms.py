"""`current_platform` and the FP8 numbers it is the single source of."""

import pytest
import torch

from vllm.platforms import (
    CpuPlatform,
    CudaPlatform,
    RocmPlatform,
    current_platform,
    resolve_platform,
)


def test_detected_platform_matches_torch():
    if torch.cuda.is_available():
        expected = RocmPlatform if torch.version.hip else CudaPlatform
    else:
        expected = CpuPlatform
    assert isinstance(current_platform, expected)


@pytest.mark.parametrize(
    "platform,dtype,fp8_max,fnuz",
    [
        (CpuPlatform(), torch.float8_e4m3fn, 448.0, False),
        (CudaPlatform(), torch.float8_e4m3fn, 448.0, False),
        (RocmPlatform(gcn_arch="gfx942:sramecc+:xnack-"), torch.float8_e4m3fnuz, 224.0, True),
        (RocmPlatform(gcn_arch="gfx950:sramecc+:xnack-"), torch.float8_e4m3fn, 448.0, False),
    ],
    ids=["cpu", "cuda", "rocm-gfx942", "rocm-gfx950"],
)
def test_fp8_dtype_and_limits(platform, dtype, fp8_max, fnuz):
    assert platform.is_fp8_fnuz() is fnuz
    assert platform.fp8_dtype() == dtype
    assert platform.fp8_max() == fp8_max
    assert platform.fp8_min_scale() == 1.0 / (fp8_max * 512.0)


def test_fp8_max_per_dtype_is_upstreams_dynamic_quant_max():
    # 224 for fnuz even though finfo says 240: upstream quantizes to 224 on ROCm.
    assert current_platform.fp8_max(torch.float8_e4m3fnuz) == 224.0
    assert torch.finfo(torch.float8_e4m3fnuz).max == 240.0
    assert current_platform.fp8_max(torch.float8_e4m3fn) == torch.finfo(torch.float8_e4m3fn).max


def test_unsupported_fp8_dtype_is_rejected():
    with pytest.raises(ValueError, match="unsupported fp8 dtype"):
        current_platform.fp8_max(torch.float8_e5m2)


def test_forced_platform_by_name():
    assert isinstance(resolve_platform("cpu"), CpuPlatform)
    assert isinstance(resolve_platform("rocm"), RocmPlatform)
    with pytest.raises(ValueError, match="VLLM_TARGET_PLATFORM"):
        resolve_platform("tpu")


def test_triton_fp8_support_by_platform():
    hopper, ampere = CudaPlatform(), CudaPlatform()
    hopper.__dict__["device_capability"] = (9, 0)  # cached_property: no GPU needed
    ampere.__dict__["device_capability"] = (8, 0)
    assert hopper.triton_supports_fp8(torch.float8_e4m3fn)
    assert not hopper.triton_supports_fp8(torch.float8_e4m3fnuz)  # no fnuz on NVIDIA
    assert not ampere.triton_supports_fp8(torch.float8_e4m3fn)  # Triton emits fp8 from sm_89
    mi300 = RocmPlatform(gcn_arch="gfx942:sramecc+:xnack-")
    assert mi300.triton_supports_fp8(torch.float8_e4m3fnuz)
    assert not mi300.triton_supports_fp8(torch.float8_e4m3fn)
    assert CpuPlatform().triton_supports_fp8(torch.float8_e4m3fnuz)  # the interpreter does both


@pytest.mark.parametrize(
    "arch,mi3xx",
    [("gfx942:sramecc+:xnack-", True), ("gfx950:sramecc+:xnack-", True), ("gfx940", True),
     ("gfx90a:sramecc+:xnack-", False), ("gfx908", False), ("gfx1201", False)],
)  # fmt: skip
def test_mi3xx_is_cdna3_or_newer(arch, mi3xx):
    assert RocmPlatform(gcn_arch=arch).on_mi3xx() is mi3xx


def test_helpers_only_tests_called_are_gone():
    """Dead code removed: no library caller ever used these (issue 10)."""
    import inspect

    import vllm.distributed
    from vllm.model_executor.layers.vocab_parallel_embedding import ParallelLMHead
    from vllm.platforms import Platform

    assert not hasattr(Platform, "fp8_min_max")  # fp8_max is the one source of truth
    assert not hasattr(vllm.distributed, "get_tp_group")
    assert list(inspect.signature(ParallelLMHead.compute_logits).parameters) == ["self", "hidden"]
