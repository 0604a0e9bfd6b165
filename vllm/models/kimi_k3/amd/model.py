"""`KimiK3ForConditionalGeneration`, text only: Kimi-K3's checkpoint around the Kimi-Linear text
model (upstream's `--language-model-only`). The language model sits under `language_model`; the
checkpoint's `language_model.layers.*` are the text model's `model.layers.*`, and the vision tower
and projector tensors are skipped.
"""

from collections.abc import Iterable

import torch

from vllm.model_executor.layers.quantization.base_config import QuantizationConfig
from vllm.models.kimi_k3.amd.kda import KDAStatePool
from vllm.models.kimi_k3.amd.linear import KimiLinearForCausalLM
from vllm.models.kimi_k3.amd.metadata import KimiMetadata
from vllm.models.kimi_k3.amd.ops.kda_prefill_graphs import CaptureProgress, KdaPrefillGraphs
from vllm.transformers_utils.configs import KimiK3Config
from vllm.v1.kv_cache_interface import KVCacheSpec

_SKIPPED_PREFIXES = ("vision_tower.", "multi_modal_projector.", "mm_projector.")


def map_k3_checkpoint_name(name: str) -> str | None:
    """Checkpoint name -> name inside `language_model`; None for the vision side."""
    if name.startswith(_SKIPPED_PREFIXES):
        return None
    if name.startswith("language_model."):
        name = name.removeprefix("language_model.")
        if not name.startswith(("model.", "lm_head.")):
            name = "model." + name
    return name


def k3_checkpoint_name(text_name: str) -> str:
    """Text-model checkpoint name -> Kimi-K3's (`model.layers.3.x` -> `language_model.layers.3.x`,
    `lm_head.weight` -> `language_model.lm_head.weight`), as K3 checkpoints spell them."""
    return "language_model." + text_name.removeprefix("model.")


class KimiK3ForConditionalGeneration(torch.nn.Module):
    # the text model's fused layers, under `language_model.`
    packed_modules_mapping = KimiLinearForCausalLM.packed_modules_mapping

    def __init__(
        self,
        config: KimiK3Config,
        params_dtype: torch.dtype | None = None,
        quant_config: QuantizationConfig | None = None,
    ) -> None:
        super().__init__()
        self.config = config
        self.language_model = KimiLinearForCausalLM(
            config.text_config, params_dtype, quant_config, prefix="language_model.model"
        )

    @staticmethod
    def checkpoint_tensors(config: KimiK3Config) -> dict[str, tuple[int, ...]]:
        """Every checkpoint tensor `config` implies, by K3's names, with its full shape."""
        text = KimiLinearForCausalLM.checkpoint_tensors(config.text_config)
        return {k3_checkpoint_name(name): shape for name, shape in text.items()}

    def forward(self, input_ids: torch.Tensor, metadata: KimiMetadata) -> torch.Tensor:
        return self.language_model(input_ids, metadata)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.language_model.compute_logits(hidden)

    def get_kv_cache_spec(self) -> dict[int, KVCacheSpec]:
        return self.language_model.get_kv_cache_spec()

    def bind_kv_caches(
        self, kda_pools: dict[int, KDAStatePool], mla_caches: dict[int, torch.Tensor]
    ) -> None:
        self.language_model.bind_kv_caches(kda_pools, mla_caches)

    def capture_prefill_graphs(
        self, max_tokens: int, max_seqs: int, progress: CaptureProgress = iter
    ) -> KdaPrefillGraphs | None:
        return self.language_model.capture_prefill_graphs(max_tokens, max_seqs, progress)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        """Load Kimi-K3 checkpoint tensors one by one; returns the canonical K3 names loaded."""
        mapped = (
            (new, tensor)
            for name, tensor in weights
            if (new := map_k3_checkpoint_name(name)) is not None
        )
        return {k3_checkpoint_name(n) for n in self.language_model.load_weights(mapped)}

    def process_weights_after_loading(self) -> None:
        self.language_model.process_weights_after_loading()
