"""`KimiK3Config`: Kimi-K3's `config.json` (`model_type` `kimi_k3`), whose `text_config` is a
Kimi-Linear config with K3's extra features. Only the text model is served (upstream's
`--language-model-only`); the vision config is kept as read, unvalidated.

The engine's token ids and context length (`eos_token_id`, `bos_token_id`, `pad_token_id`,
`max_position_embeddings`) may sit at the top level or in `text_config`; either way they end up
in `text_config` and are readable from both objects.
"""

from dataclasses import dataclass, field
from typing import Any

from vllm.transformers_utils.configs.kimi_linear import KimiLinearConfig

_ENGINE_FIELDS = ("eos_token_id", "bos_token_id", "pad_token_id", "max_position_embeddings")


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
        text = dict(text)
        for name in _ENGINE_FIELDS:
            if name not in config:
                continue
            if name in text and text[name] != config[name]:
                raise ValueError(
                    f"config field {name!r}: top level {config[name]!r} disagrees with "
                    f"text_config.{name} {text[name]!r}"
                )
            text[name] = config[name]
        try:
            text_config = KimiLinearConfig.from_dict(text)
        except ValueError as e:
            message = str(e).replace("config field '", "config field 'text_config.", 1)
            raise ValueError(message) from None
        return cls(text_config, dict(config.get("vision_config") or {}))

    @property
    def eos_token_id(self) -> int | list[int] | None:
        return self.text_config.eos_token_id

    @property
    def bos_token_id(self) -> int | None:
        return self.text_config.bos_token_id

    @property
    def pad_token_id(self) -> int | None:
        return self.text_config.pad_token_id

    @property
    def max_position_embeddings(self) -> int:
        return self.text_config.max_position_embeddings
