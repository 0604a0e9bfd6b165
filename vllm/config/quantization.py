"""`--quantization-config`: which layers are quantized online, and how.

The JSON object of upstream's recipe, for example (the PR's: only attention `o_proj` layers)::

    {"linear": "fp8_per_channel", "ignore": ["re:(?!.*self_attn\\\\.o_proj$).*"]}

Fields: `linear` takes an online shorthand (`fp8_per_channel`: per-channel FP8 weights with dynamic
per-token activations) or a weight quant-key name, or `{"weight": <name>}`;
`OnlineQuantizationConfig` requires it (upstream refuses a config that sets none of its schemes:
it would quantize no layer). `moe` is parsed by upstream but refused here by name: MoE online FP8
is not implemented, and accepting it would leave every routed expert in bf16 while the user
believes them FP8 (a shared expert is a plain MLP of linears: `linear` quantizes it). `ignore`
lists module paths that stay unquantized. An `ignore` pattern starting with `re:` is a regular
expression matched with `re.match` against the full module path (anchored at the start only, as
upstream); any other pattern matches by equality or fnmatch. A
fused layer that matches nothing by its own name is ignored when all of its shards are, and mixing
ignored and quantized shards is an error. `targets` (upstream's per-pattern shorthands) is not
supported yet and is rejected by name, as is an explicit `activation` (online methods choose their
activation quantization).
"""

import fnmatch
import json
import re
from dataclasses import dataclass, field
from typing import Any

from vllm.model_executor.layers.quantization.utils.quant_utils import (
    QuantKey,
    kFp8DynamicTensorSym,
    kFp8DynamicTokenSym,
    kFp8StaticChannelSym,
    kFp8StaticTensorSym,
)

QUANT_KEY_NAMES: dict[str, QuantKey] = {
    "fp8_per_token": kFp8DynamicTokenSym,
    "fp8_per_tensor": kFp8DynamicTensorSym,
    "fp8_per_tensor_static": kFp8StaticTensorSym,
    "fp8_per_channel_static": kFp8StaticChannelSym,
}


def quant_key_name(key: QuantKey) -> str:
    """`key` as a user spells it in `--quantization-config` (its `QUANT_KEY_NAMES` name), else its
    own text."""
    return next((name for name, k in QUANT_KEY_NAMES.items() if k == key), str(key))


class FusedLayerSplitError(ValueError):
    """`ignore` patterns that match some shards of a fused layer and not others (found while the
    model's layers are built)."""


@dataclass(frozen=True)
class QuantSpec:
    """How one kind of layer is quantized: its weight key (the activation follows the method)."""

    weight: QuantKey


ONLINE_SHORTHANDS: dict[str, dict[str, QuantSpec]] = {
    "fp8_per_channel": {
        "linear": QuantSpec(kFp8StaticChannelSym),
    },
}

_FIELDS = ("linear", "moe", "ignore")
_UNSUPPORTED_FIELDS = {
    "targets": "is not supported yet",
    "moe": "MoE online FP8 is not implemented (the routed experts would stay bf16; shared "
    "experts are linears, which `linear` quantizes); "
    "remove it, or set it to null",
}


@dataclass
class QuantizationConfigArgs:
    """The parsed `--quantization-config`."""

    linear: QuantSpec | None = None
    ignore: list[str] = field(default_factory=list)
    _compiled: list[re.Pattern | str] = field(init=False, repr=False)
    # Indices of the `ignore` patterns that matched a module path asked about so far.
    _matched: set[int] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        self._compiled = []
        self._matched = set()
        for i, pattern in enumerate(self.ignore):
            if not pattern.startswith("re:"):
                self._compiled.append(pattern)
                continue
            try:
                self._compiled.append(re.compile(pattern[3:]))
            except re.error as e:
                raise ValueError(
                    f"quantization config field 'ignore[{i}]': invalid regex {pattern[3:]!r}: {e}"
                ) from None

    def should_ignore(self, prefix: str, fused_shards: list[str] | None = None) -> bool:
        """Whether the layer at module path `prefix` stays unquantized.

        `fused_shards` names the checkpoint modules a fused layer stands for (for example
        `["gate_proj", "up_proj"]` for `gate_up_proj`): they decide when the fused name matches
        nothing.
        """
        matched = self._matches(prefix)
        if not fused_shards:
            return matched
        parent = prefix.rsplit(".", 1)[0] + "." if "." in prefix else ""
        # Tried even when the fused name decided, so that a pattern naming a shard of an ignored
        # layer counts as used: it selects that layer too.
        verdicts = {shard: self._matches(parent + shard) for shard in fused_shards}
        if matched:
            return True
        if len(set(verdicts.values())) > 1:
            raise FusedLayerSplitError(
                f"quantization config field 'ignore': the patterns split the fused layer "
                f"{prefix!r}: {verdicts}; a fused layer is "
                "quantized as one, so ignore all of its shards or none"
            )
        return next(iter(verdicts.values()))

    def unmatched_ignore(self) -> list[str]:
        """The `ignore` patterns that matched none of the module paths (fused shards included)
        asked about so far: after a model is built, patterns that select no layer of it."""
        return [p for i, p in enumerate(self.ignore) if i not in self._matched]

    def _matches(self, name: str) -> bool:
        # Every pattern is tried (not only up to the first match), so that each one that
        # selects a layer is recorded as used.
        found = False
        for i, pattern in enumerate(self._compiled):
            if isinstance(pattern, re.Pattern):
                hit = pattern.match(name) is not None
            else:
                hit = name == pattern or fnmatch.fnmatch(name, pattern)
            if hit:
                self._matched.add(i)
                found = True
        return found


def _spec(field_name: str, value: Any) -> QuantSpec | None:
    if value is None:
        return None
    if isinstance(value, str):
        if value in ONLINE_SHORTHANDS:
            return ONLINE_SHORTHANDS[value][field_name]
        if value in QUANT_KEY_NAMES:
            return QuantSpec(QUANT_KEY_NAMES[value])
        raise ValueError(
            f"quantization config field {field_name!r}: unknown scheme {value!r}; expected one of "
            f"{sorted(ONLINE_SHORTHANDS) + sorted(QUANT_KEY_NAMES)}"
        )
    if isinstance(value, dict):
        unknown = set(value) - {"weight", "activation"}
        if unknown:
            raise ValueError(f"quantization config field {field_name!r}: unknown keys {unknown}")
        if value.get("activation") is not None:  # null is upstream's default: no override
            raise ValueError(
                f"quantization config field '{field_name}.activation': an activation override is "
                "not supported for online quantization (the method sets it)"
            )
        if "weight" not in value:
            raise ValueError(f"quantization config field {field_name!r} needs a 'weight'")
        weight = value["weight"]
        if not isinstance(weight, str):
            # A null weight would quantize nothing, silently; a nested object is no scheme name.
            raise ValueError(
                f"quantization config field '{field_name}.weight' must be a scheme name, got "
                f"{weight!r}"
            )
        return _spec(field_name, weight)
    raise ValueError(
        f"quantization config field {field_name!r} must be a string or an object, got "
        f"{type(value).__name__}"
    )


def parse_quantization_config(config: "str | dict[str, Any]") -> QuantizationConfigArgs:
    """Parse `--quantization-config` (a JSON string or an already decoded object)."""
    if isinstance(config, str):
        try:
            config = json.loads(config)
        except json.JSONDecodeError as e:
            raise ValueError(f"--quantization-config is not valid JSON: {e}") from None
    if not isinstance(config, dict):
        raise ValueError(
            f"--quantization-config must be a JSON object, got {type(config).__name__}"
        )
    for name in config:
        if name in _UNSUPPORTED_FIELDS and config[name] is not None:
            raise ValueError(f"quantization config field {name!r}: {_UNSUPPORTED_FIELDS[name]}")
        if name not in _FIELDS and name not in _UNSUPPORTED_FIELDS:
            raise ValueError(
                f"quantization config has an unknown field {name!r}; expected {list(_FIELDS)}"
            )
    ignore = config.get("ignore", [])
    if not isinstance(ignore, list) or not all(isinstance(p, str) for p in ignore):
        raise ValueError("quantization config field 'ignore' must be a list of strings")
    return QuantizationConfigArgs(
        linear=_spec("linear", config.get("linear")),
        ignore=list(ignore),
    )
