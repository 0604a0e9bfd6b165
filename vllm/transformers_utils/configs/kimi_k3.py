"""`KimiK3Config`: Kimi-K3's `config.json` (`model_type` `kimi_k3`), whose `text_config` is a
Kimi-Linear config with K3's extra features. Only the text model is served (upstream's
`--language-model-only`); the vision config is kept as read, unvalidated.
"""

from dataclasses import dataclass, field
from typing import Any

from vllm.transformers_utils.configs.kimi_linear import KimiLinearConfig


@dataclass
class KimiK3Config:
    text_config: KimiLinearConfig
    vision_config: dict[str, Any] = field(default_factory=dict)
    model_type: str = "kimi_k3"

    @classmethod
    def from_dict(cls, config: dict[str, Any]) -> "KimiK3Config":
        text = config.get("text_config")
        if not isinstance(text, dict):
            raise ValueError("config field 'text_config': a kimi_k3 config needs an object")
        try:
            text_config = KimiLinearConfig.from_dict(text)
        except ValueError as e:
            message = str(e).replace("config field '", "config field 'text_config.", 1)
            raise ValueError(message) from None
        return cls(text_config, dict(config.get("vision_config") or {}))
