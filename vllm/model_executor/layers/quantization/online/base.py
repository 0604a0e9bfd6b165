"""`OnlineQuantizationConfig`: applies a parsed `--quantization-config` to a model's layers."""

import torch

from vllm.config.quantization import (
    ONLINE_SHORTHANDS,
    QUANT_KEY_NAMES,
    QuantizationConfigArgs,
    quant_key_name,
)
from vllm.model_executor.layers.linear import LinearBase, LinearMethodBase
from vllm.model_executor.layers.quantization.base_config import QuantizationConfig
from vllm.model_executor.layers.quantization.online.fp8 import Fp8PtpcOnlineLinearMethod
from vllm.model_executor.layers.quantization.utils.quant_utils import (
    QuantKey,
    kFp8StaticChannelSym,
)

_ONLINE_LINEAR_METHODS: dict[QuantKey, type[LinearMethodBase]] = {
    kFp8StaticChannelSym: Fp8PtpcOnlineLinearMethod,
}


class OnlineQuantizationConfig(QuantizationConfig):
    """Online quantization of the linear layers the config selects.

    `packed_modules_mapping` maps a fused layer name to the checkpoint modules it holds, for the
    ignore rule on fused layers.
    """

    def __init__(
        self,
        args: QuantizationConfigArgs,
        packed_modules_mapping: dict[str, list[str]] | None = None,
    ) -> None:
        self.args = args
        self.packed_modules_mapping = packed_modules_mapping or {}
        if args.linear is not None and args.linear.weight not in _ONLINE_LINEAR_METHODS:
            supported = [n for n, spec in ONLINE_SHORTHANDS.items() if "linear" in spec
                         and spec["linear"].weight in _ONLINE_LINEAR_METHODS]  # fmt: skip
            supported += [n for n, k in QUANT_KEY_NAMES.items() if k in _ONLINE_LINEAR_METHODS]
            raise ValueError(
                f"quantization config field 'linear': no online method for "
                f"{quant_key_name(args.linear.weight)!r}; online "
                f"quantization supports {sorted(supported)}"
            )

    def get_quant_method(self, layer: torch.nn.Module, prefix: str) -> LinearMethodBase | None:
        if not isinstance(layer, LinearBase) or self.args.linear is None:
            return None
        shards = self.packed_modules_mapping.get(prefix.rsplit(".", 1)[-1])
        if self.args.should_ignore(prefix, shards):
            return None
        return _ONLINE_LINEAR_METHODS[self.args.linear.weight]()
