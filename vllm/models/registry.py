"""Which model class serves a checkpoint's config: the one place generic code (the loader, the
model runner) learns of a model implementation, named by module path and imported on first use,
so generic modules never import a model package.

A registered class is built as `cls(config, params_dtype, quant_config)` and provides
`checkpoint_tensors(config)` (canonical checkpoint name -> full shape), `load_weights(weights)`
(returning the canonical names it loaded), `process_weights_after_loading()` and
`packed_modules_mapping` (fused layer -> the checkpoint modules it holds).
"""

import importlib

import torch

# config.model_type -> (module, class)
_MODELS = {
    "kimi_linear": ("vllm.models.kimi_k3.amd.linear", "KimiLinearForCausalLM"),
    "kimi_k3": ("vllm.models.kimi_k3.amd.model", "KimiK3ForConditionalGeneration"),
}


def model_class(config: object) -> type[torch.nn.Module]:
    """The model class for `config` (by its `model_type`); ValueError naming an unknown type."""
    model_type = getattr(config, "model_type", None)
    if model_type not in _MODELS:
        raise ValueError(
            f"config: no model for model_type {model_type!r} (known: {', '.join(_MODELS)})"
        )
    module, name = _MODELS[model_type]
    return getattr(importlib.import_module(module), name)
