"""Choice of the kernel behind each quantized linear, by platform, with an env override.

`init_fp8_linear_kernel` walks the platform's candidates in order and takes the first that is
supported here and can implement the layer; `VLLM_FP8_LINEAR_KERNEL=<class name>` (or the
`force_kernel` argument) picks one explicitly and fails loudly if it cannot run, with an
`EnvVarError` naming the variable, the layer and the kernel's reason.
"""

import torch

import vllm.platforms
from vllm import envs
from vllm.config.quantization import quant_key_name
from vllm.envs import EnvVarError
from vllm.logger import init_logger
from vllm.model_executor.kernels.linear.scaled_mm.aiter import (
    AiterHipbMMPerTokenFp8ScaledMMLinearKernel,
    AiterPerTokenFp8ScaledMMLinearKernel,
    AiterPreshuffledPerTokenFp8ScaledMMLinearKernel,
)
from vllm.model_executor.kernels.linear.scaled_mm.pytorch import (
    ChannelWiseTorchFP8ScaledMMLinearKernel,
    PerTensorTorchFP8ScaledMMLinearKernel,
    RowWiseTorchFP8ScaledMMLinearKernel,
)
from vllm.model_executor.kernels.linear.scaled_mm.ScaledMMLinearKernel import (
    FP8ScaledMMLinearKernel,
    FP8ScaledMMLinearLayerConfig,
)
from vllm.model_executor.layers.quantization.utils.quant_utils import QuantKey
from vllm.platforms import PlatformEnum

logger = init_logger(__name__)

# In order of preference per platform. PerTensorTorch is only ever forced.
_POSSIBLE_FP8_KERNELS: dict[PlatformEnum, list[type[FP8ScaledMMLinearKernel]]] = {
    PlatformEnum.ROCM: [
        AiterHipbMMPerTokenFp8ScaledMMLinearKernel,
        AiterPreshuffledPerTokenFp8ScaledMMLinearKernel,
        AiterPerTokenFp8ScaledMMLinearKernel,
        RowWiseTorchFP8ScaledMMLinearKernel,
        ChannelWiseTorchFP8ScaledMMLinearKernel,
    ],
    PlatformEnum.CUDA: [
        RowWiseTorchFP8ScaledMMLinearKernel,
        ChannelWiseTorchFP8ScaledMMLinearKernel,
    ],
    PlatformEnum.CPU: [ChannelWiseTorchFP8ScaledMMLinearKernel],
}

ALL_FP8_KERNELS: dict[str, type[FP8ScaledMMLinearKernel]] = {
    cls.__name__: cls
    for kernels in (*_POSSIBLE_FP8_KERNELS.values(), [PerTensorTorchFP8ScaledMMLinearKernel])
    for cls in kernels
}


def init_fp8_linear_kernel(
    activation_quant_key: QuantKey,
    weight_quant_key: QuantKey,
    input_dtype: torch.dtype,
    out_dtype: torch.dtype | None,
    weight_shape: tuple[int, int],
    force_kernel: str | None = None,
    module_name: str | None = None,
) -> FP8ScaledMMLinearKernel:
    """The FP8 kernel for a layer with local weight shape `(N, K)`."""
    config = FP8ScaledMMLinearLayerConfig(
        activation_quant_key, weight_quant_key, tuple(weight_shape), input_dtype, out_dtype
    )
    forced = force_kernel or envs.VLLM_FP8_LINEAR_KERNEL
    if forced:
        try:
            candidates = [ALL_FP8_KERNELS[forced]]
        except KeyError:
            raise EnvVarError(
                f"VLLM_FP8_LINEAR_KERNEL={forced!r} is not one of {sorted(ALL_FP8_KERNELS)}"
            ) from None
    else:
        candidates = _POSSIBLE_FP8_KERNELS[vllm.platforms.current_platform._enum]
    name = module_name or "an FP8 linear"
    reasons = []
    for cls in candidates:
        ok, reason = cls.is_supported()
        if ok:
            ok, reason = cls.can_implement(config)
        if ok:
            if cls is ChannelWiseTorchFP8ScaledMMLinearKernel and reasons:
                # On a GPU this dequantizes the weight on every call: far slower than the FP8 GEMM.
                logger.warning("%s falls back to %s: %s", name, cls.__name__, "; ".join(reasons))
            else:
                logger.info("Selected %s for %s", cls.__name__, name)
            return cls(config)
        reasons.append(f"{cls.__name__}: {reason}")
    n, k = weight_shape
    layer = (
        f"{name} (N={n}, K={k}, {quant_key_name(activation_quant_key)} activations, "
        f"{quant_key_name(weight_quant_key)} weights, {input_dtype} in, {out_dtype} out)"
    )
    if forced:
        raise EnvVarError(f"VLLM_FP8_LINEAR_KERNEL={forced!r} cannot run {layer}: {reasons[0]}")
    raise ValueError(f"no FP8 linear kernel can run {layer}: " + "; ".join(reasons))
