"""`load_model`: config -> model -> weights (checkpoint or dummy) -> post-processing.

`kimi_linear` checkpoints build `KimiLinearForCausalLM`, `kimi_k3` ones the text-only
`KimiK3ForConditionalGeneration` (which maps K3's names). Checkpoint loading checks completeness:
every parameter starts as NaN, and a parameter still holding NaN after loading is reported by its
module path (for fused parameters, one of the checkpoint tensors it is built from is missing).
`load_format="dummy"` fills random weights at realistic scales instead, the same for the same
seed.
"""

import math
import os

import torch

from vllm.logger import init_logger
from vllm.model_executor.layers.quantization.base_config import QuantizationConfig
from vllm.model_executor.model_loader.builtin import resolve_model
from vllm.model_executor.model_loader.safetensors_loader import iterate_tensors
from vllm.models.kimi_k3.amd.linear import KimiLinearForCausalLM
from vllm.models.kimi_k3.amd.model import KimiK3ForConditionalGeneration
from vllm.transformers_utils.configs import KimiK3Config, load_model_config

logger = init_logger(__name__)


def load_model(
    model_path: "str | os.PathLike",
    load_format: str = "auto",
    dtype: torch.dtype = torch.bfloat16,
    quant_config: QuantizationConfig | None = None,
    device: "str | torch.device" = "cpu",
    seed: int = 0,
) -> "KimiLinearForCausalLM | KimiK3ForConditionalGeneration":
    """Build the model of a checkpoint folder (or built-in tiny model name) and fill its weights.

    A built-in tiny model has no weight files: "auto" gives it the dummy weights of seed 0.
    """
    folder, builtin = resolve_model(model_path)
    config = load_model_config(folder)
    if isinstance(config, KimiK3Config):
        model = KimiK3ForConditionalGeneration(config, dtype, quant_config)
    else:
        model = KimiLinearForCausalLM(config, dtype, quant_config)
    if builtin and load_format == "auto":
        load_format, seed = "dummy", 0
    if load_format == "dummy":
        fill_dummy_weights(model, seed)
    elif load_format in ("auto", "safetensors"):
        _poison(model)
        model.load_weights(iterate_tensors(folder))
        _check_complete(model)
    else:
        raise ValueError(f"load_format {load_format!r} is not 'auto', 'safetensors' or 'dummy'")
    model.to(device)
    model.process_weights_after_loading()
    logger.info("Loaded %s (%s weights) from %s", type(model).__name__, load_format, folder)
    return model.eval()


def _poison(model: torch.nn.Module) -> None:
    with torch.no_grad():
        for p in model.parameters():
            if p.is_floating_point():
                p.fill_(float("nan"))


def _check_complete(model: torch.nn.Module) -> None:
    # Parameter path -> checkpoint name: Kimi-Linear's lack the `model.` of its layers and
    # norms; Kimi-K3's wrapper paths (`language_model.layers.*`, ...) already are K3 names.
    missing = [
        name if name.startswith(("lm_head", "language_model.")) else f"model.{name}"
        for name, p in model.named_parameters()
        if torch.isnan(p).any()
    ]
    if missing:
        shown = ", ".join(missing[:5]) + (
            f" and {len(missing) - 5} more" if len(missing) > 5 else ""
        )
        raise ValueError(f"the checkpoint is missing tensors for the parameters: {shown}")


def fill_dummy_weights(model: torch.nn.Module, seed: int = 0) -> None:
    """Random weights at about the scales of a trained model, deterministic for `seed`.

    Drawn from each rank's local shapes: at TP>1 ranks differ even in replicated weights."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            leaf = name.rsplit(".", 1)[-1]
            if leaf == "A_log":
                value = torch.log(torch.rand(p.shape, generator=gen) * 15 + 1)
            elif leaf == "dt_bias" or leaf == "e_score_correction_bias":
                value = torch.randn(p.shape, generator=gen) * 0.1
            elif "norm" in name:
                value = 1 + torch.randn(p.shape, generator=gen) * 0.05
            elif p.dim() >= 2:
                fan_in = p.shape[-1]
                value = torch.randn(p.shape, generator=gen) / math.sqrt(fan_in)
            else:
                value = torch.randn(p.shape, generator=gen) * 0.02
            p.copy_(value.to(p.dtype))
