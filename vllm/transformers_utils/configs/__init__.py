"""Config classes of the models this fork serves, with upstream's `config.json` field names."""

from vllm.transformers_utils.configs.kimi_k3 import KimiK3Config
from vllm.transformers_utils.configs.kimi_linear import KimiLinearConfig, load_model_config

__all__ = ["KimiK3Config", "KimiLinearConfig", "load_model_config"]
