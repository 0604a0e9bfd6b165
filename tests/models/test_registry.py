"""The model registry: config -> model class, without generic code importing a model package."""

import pytest

from vllm.model_executor.model_loader.builtin import BUILTIN_MODELS
from vllm.models.registry import model_class
from vllm.transformers_utils.configs import load_model_config


@pytest.mark.parametrize(
    "name,cls",
    [
        ("kimi-linear-tiny", "KimiLinearForCausalLM"),
        ("kimi-k3-tiny", "KimiK3ForConditionalGeneration"),
    ],
)
def test_builtin_configs_get_their_model_class(name, cls):
    model = model_class(load_model_config(BUILTIN_MODELS[name]))
    assert model.__name__ == cls
    # what the loader and the runner read from the class
    assert "in_proj_qkvgfab" in model.packed_modules_mapping
    assert callable(model.checkpoint_tensors)


def test_k3_checkpoint_tensors_are_the_text_models_under_language_model():
    config = load_model_config(BUILTIN_MODELS["kimi-k3-tiny"])
    k3 = model_class(config).checkpoint_tensors(config)
    text = model_class(config.text_config).checkpoint_tensors(config.text_config)
    assert list(k3.values()) == list(text.values())
    assert "language_model.layers.0.input_layernorm.weight" in k3
    assert all(name.startswith("language_model.") for name in k3)


def test_unknown_model_type_is_refused_by_name():
    class Config:
        model_type = "llama"

    with pytest.raises(ValueError, match="no model for model_type 'llama'"):
        model_class(Config())
