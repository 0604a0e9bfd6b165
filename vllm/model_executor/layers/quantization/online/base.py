"""`OnlineQuantizationConfig`: applies a parsed `--quantization-config` to a model's layers."""

import torch

from vllm.config.quantization import (
    ONLINE_SHORTHANDS,
    QUANT_KEY_NAMES,
    QuantizationConfigArgs,
    quant_key_name,
)
from vllm.distributed.parallel_state import get_tensor_model_parallel_rank
from vllm.logger import init_logger
from vllm.model_executor.layers.linear import LinearBase, LinearMethodBase
from vllm.model_executor.layers.quantization.base_config import QuantizationConfig
from vllm.model_executor.layers.quantization.online.fp8 import Fp8PtpcOnlineLinearMethod
from vllm.model_executor.layers.quantization.utils.quant_utils import (
    QuantKey,
    kFp8StaticChannelSym,
)

logger = init_logger(__name__)

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
        self._example_path: str | None = None  # a linear layer's module path, for messages
        if args.linear is None:
            # As upstream, which refuses a config that sets none of its schemes: this one would
            # quantize no layer while the user believes the model quantized.
            raise ValueError(
                "quantization config field 'linear' must name a scheme (e.g. 'fp8_per_channel'): "
                "without one no layer is quantized"
            )
        if args.linear.weight not in _ONLINE_LINEAR_METHODS:
            supported = [n for n, spec in ONLINE_SHORTHANDS.items() if "linear" in spec
                         and spec["linear"].weight in _ONLINE_LINEAR_METHODS]  # fmt: skip
            supported += [n for n, k in QUANT_KEY_NAMES.items() if k in _ONLINE_LINEAR_METHODS]
            raise ValueError(
                f"quantization config field 'linear': no online method for "
                f"{quant_key_name(args.linear.weight)!r}; online "
                f"quantization supports {sorted(supported)}"
            )

    def get_quant_method(self, layer: torch.nn.Module, prefix: str) -> LinearMethodBase | None:
        if not isinstance(layer, LinearBase):
            return None
        if self._example_path is None:
            self._example_path = prefix
        # The shards the layer holds when it names them: the model-wide mapping lists every shard
        # a fused layer may hold (KDA's g_proj or g_a_proj, MLA's gate, by config), and one this
        # layer lacks would count as not ignored, refusing a rule that covers all of its shards.
        shards = layer.shard_names or self.packed_modules_mapping.get(prefix.rsplit(".", 1)[-1])
        if self.args.should_ignore(prefix, shards):
            return None
        return _ONLINE_LINEAR_METHODS[self.args.linear.weight]()

    def check_model_built(self, model: torch.nn.Module) -> None:
        """Warn (once, on rank 0) about `ignore` patterns that matched no linear layer of the
        model just built: a pattern spelled after another naming (a checkpoint's
        `language_model.layers.N` where the layer's prefix is `language_model.model.layers.N`)
        or with a typo would otherwise leave the layers it meant to keep in bf16 quantized,
        silently. A pattern naming a module that is never quantized (`lm_head`) is reported
        too: it keeps nothing unquantized either."""
        if get_tensor_model_parallel_rank() != 0:
            return
        unmatched = self.args.unmatched_ignore()
        if unmatched:
            logger.warning(
                "quantization config field 'ignore': %d pattern(s) match no linear layer of the "
                "model, so they keep nothing unquantized: %s (layer prefixes look like %r)",
                len(unmatched), unmatched, self._example_path,
            )  # fmt: skip
