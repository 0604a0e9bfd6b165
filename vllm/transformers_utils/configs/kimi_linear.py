"""`KimiLinearConfig`: the Kimi-Linear text model's `config.json`, with upstream vLLM's field names
and semantics (upstream-facts D.1, engine-facts 5), validated at load.

transformers' own `KimiLinearConfig` renames the linear-attention fields (`linear_num_heads`, ...)
and lacks Kimi-K3's (`gate_lower_bound`, `use_full_rank_gate`, latent MoE, SiTU, AttnRes), so this
fork reads the checkpoint's names directly. `is_kda_layer` is 1-based as upstream: 0-based layer
`i` is KDA iff `i + 1` is in `linear_attn_config["kda_layers"]`; every other layer is MLA.

Every field is type- and range-checked at load (a JSON `true` is not an integer, a string is not a
boolean), so a bad checkpoint fails here with the field's name instead of deep in a kernel. Fields
the fork does not read are not kept; docs/model.md lists them. A checkpoint's own
`quantization_config` (at the top or in `text_config`) is one of them, but not silently: the
fork loads floating-point weights of 16 bits or more only (PTPC quantizes them online), so
`load_model_config(..., warn_checkpoint_quantization=True)`, which `EngineArgs` calls once per
engine, warns that the model will run unquantized and that the checkpoint's quantized tensors
will be refused.
"""

import json
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from vllm.logger import init_logger

logger = init_logger(__name__)

_LINEAR_ATTN_KEYS = {
    "kda_layers", "full_attn_layers", "num_heads", "head_dim", "short_conv_kernel_size",
    "gate_lower_bound", "use_full_rank_gate",
}  # fmt: skip
_ACTIVATIONS = ("silu", "situ")
# head_dim limit of the fused KDA decode kernel (ops/fused_kda_decode.py): one power-of-two tile
_MAX_KDA_HEAD_DIM = 256
# The short conv's widths the conv kernels take (ops/causal_conv1d.py, `MAX_WIDTH`): a window of
# W - 1 past tokens, at least one.
_CONV_WIDTHS = (2, 4)
# Widest MLA cache row, kv_lora_rank + qk_rope_head_dim: the cache write normalizes the latent
# in one row tile (ops/mla_cache_write.py, the rms_norm's `MAX_HIDDEN`).
_MAX_MLA_CACHE_ROW = 65536

# Type and range of every scalar field, checked before any semantic rule reads them.
_POSITIVE_INTS = (
    "vocab_size",
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "max_position_embeddings",
    "kv_lora_rank",
    "qk_nope_head_dim",
    "v_head_dim",
    "num_experts_per_token",
    "moe_intermediate_size",
    "moe_layer_freq",
    "num_expert_group",
    "topk_group",
)
_NON_NEGATIVE_INTS = (
    "qk_rope_head_dim",
    "num_shared_experts",
    "first_k_dense_replace",
    "num_nextn_predict_layers",
)
_OPTIONAL_POSITIVE_INTS = (
    "q_lora_rank",
    "num_experts",
    "routed_expert_hidden_size",
    "attn_res_block_size",
)
_OPTIONAL_TOKEN_IDS = ("bos_token_id", "pad_token_id")
_BOOLS = (
    "tie_word_embeddings",
    "mla_use_nope",
    "mla_use_output_gate",
    "moe_renormalize",
    "use_grouped_topk",
    "latent_moe_use_norm",
)
_POSITIVE_FLOATS = ("rms_norm_eps", "routed_scaling_factor")
_OPTIONAL_FLOATS = ("activation_situ_beta", "activation_situ_linear_beta")
_STRINGS = ("hidden_act", "moe_router_activation_func", "topk_method")


def _fail(name: str, message: str) -> None:
    raise ValueError(f"config field {name!r}: {message}")


def _is_int(value: Any) -> bool:
    # bool is an int subclass: a JSON `true` must not silently mean 1
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


# Sizes, counts and ids fit torch's int32 indexing (and a size of 10**30 overflowed inside
# torch.empty without naming its field).
_MAX_INT = 2**31 - 1


def _check_int(name: str, value: Any, minimum: int) -> None:
    if not _is_int(value) or value < minimum:
        kind = "a positive integer" if minimum > 0 else "a non-negative integer"
        _fail(name, f"must be {kind}, got {value!r}")
    if value > _MAX_INT:
        _fail(name, f"must be at most {_MAX_INT}, got {value!r}")


@dataclass
class KimiLinearConfig:
    """Kimi-Linear / Kimi-K3 text model hyper-parameters (`model_type` `kimi_linear`)."""

    vocab_size: int = 163840
    hidden_size: int = 2304
    intermediate_size: int = 9216
    num_hidden_layers: int = 27
    num_attention_heads: int = 32
    hidden_act: str = "silu"
    rms_norm_eps: float = 1e-6
    max_position_embeddings: int = 1048576
    tie_word_embeddings: bool = False
    # kept for the engine (stop on EOS, padding); not used by the model itself
    eos_token_id: int | list[int] | None = None
    bos_token_id: int | None = None
    pad_token_id: int | None = None
    # MLA
    q_lora_rank: int | None = None
    kv_lora_rank: int = 512
    qk_nope_head_dim: int = 128
    qk_rope_head_dim: int = 64
    v_head_dim: int = 128
    # True by default: transformers' save_pretrained omits the field and its Kimi-Linear is NoPE.
    mla_use_nope: bool = True
    mla_use_output_gate: bool = False
    # MoE
    num_experts: int | None = None
    num_experts_per_token: int = 8
    moe_intermediate_size: int = 1024
    moe_renormalize: bool = True
    moe_router_activation_func: str = "sigmoid"
    num_shared_experts: int = 0
    routed_scaling_factor: float = 1.0
    first_k_dense_replace: int = 0
    moe_layer_freq: int = 1
    use_grouped_topk: bool = True
    num_expert_group: int = 1
    topk_group: int = 1
    topk_method: str = "noaux_tc"
    routed_expert_hidden_size: int | None = None  # Kimi-K3's latent MoE
    latent_moe_use_norm: bool = False
    # activations and residuals (Kimi-K3)
    activation_situ_beta: float | None = None
    activation_situ_linear_beta: float | None = None
    attn_res_block_size: int | None = None
    num_nextn_predict_layers: int = 0
    linear_attn_config: dict[str, Any] = field(default_factory=dict)
    model_type: str = "kimi_linear"

    @classmethod
    def from_dict(cls, config: dict[str, Any]) -> "KimiLinearConfig":
        """Build and validate from a `config.json` object; unknown fields are ignored as HF does
        (checkpoints carry bookkeeping such as `architectures` and `torch_dtype`)."""
        known = {f.name for f in fields(cls)}
        values = {k: v for k, v in config.items() if k in known}
        if "rope_scaling" in config and config["rope_scaling"] is not None:
            _fail("rope_scaling", "not supported: Kimi MLA layers use no rotary embedding")
        # transformers' Kimi-Linear config keeps `max_position_embeddings` as `model_max_length`
        # (its attribute map): its save_pretrained, like the published config, writes only that
        # name. Upstream's context limit is the smaller of the two keys present.
        limit = config.get("model_max_length")
        if _is_int(limit) and limit > _MAX_INT:
            limit = None  # transformers writes int(1e30) for "no limit"
        if limit is not None:
            _check_int("model_max_length", limit, 1)
            own = values.get("max_position_embeddings")
            if own is None or _is_int(own):  # any other value is refused by `validate`
                values["max_position_embeddings"] = limit if own is None else min(own, limit)
        self = cls(**values)
        self.validate()
        return self

    # -- derived facts -------------------------------------------------------------------------

    @property
    def kda_num_heads(self) -> int:
        return self.linear_attn_config["num_heads"]

    @property
    def kda_head_dim(self) -> int:
        return self.linear_attn_config["head_dim"]

    @property
    def kda_conv_kernel_size(self) -> int:
        return self.linear_attn_config.get("short_conv_kernel_size", 4)

    @property
    def gate_lower_bound(self) -> float | None:
        return self.linear_attn_config.get("gate_lower_bound")

    @property
    def use_full_rank_gate(self) -> bool:
        return bool(self.linear_attn_config.get("use_full_rank_gate", False))

    def is_kda_layer(self, layer_idx: int) -> bool:
        """Whether 0-based layer `layer_idx` is KDA (the config's list is 1-based)."""
        return layer_idx + 1 in self.linear_attn_config["kda_layers"]

    def is_moe_layer(self, layer_idx: int) -> bool:
        return (
            self.num_experts is not None
            and layer_idx >= self.first_k_dense_replace
            and layer_idx % self.moe_layer_freq == 0
        )

    # -- validation ----------------------------------------------------------------------------

    def validate(self) -> None:
        """Raise ValueError naming the first invalid or unsupported field."""
        self._validate_types()
        if self.hidden_act not in _ACTIVATIONS:
            _fail("hidden_act", f"{self.hidden_act!r} is not one of {_ACTIVATIONS}")
        if self.hidden_act == "situ" and (
            self.activation_situ_beta is None or self.activation_situ_linear_beta is None
        ):
            _fail("activation_situ_beta", "SiTU needs activation_situ_beta and _linear_beta")
        if not self.mla_use_nope:
            _fail("mla_use_nope", "only NoPE MLA (no rotary embedding) is supported, as upstream")
        if self.moe_router_activation_func not in ("sigmoid", "softmax"):
            _fail("moe_router_activation_func", "must be 'sigmoid' or 'softmax'")
        if self.topk_method != "noaux_tc":
            _fail("topk_method", f"only 'noaux_tc' is supported, got {self.topk_method!r}")
        if self.num_experts is not None:
            if self.num_experts_per_token > self.num_experts:
                _fail("num_experts_per_token", "exceeds num_experts")
            if self.num_experts % self.num_expert_group:
                _fail("num_expert_group", "must divide num_experts")
            if self.topk_group > self.num_expert_group:
                _fail("topk_group", "exceeds num_expert_group")
            per_group = self.num_experts // self.num_expert_group
            if self.num_expert_group > 1 and per_group < 2:
                _fail("num_expert_group", "groups are ranked by their best two experts: need >= 2")
            if self.topk_group * per_group < self.num_experts_per_token:
                _fail("topk_group", "the kept groups hold fewer experts than num_experts_per_token")
        if not self.use_grouped_topk and self.num_expert_group > 1:
            # the router always ranks groups when there are several: refuse the other meaning
            _fail("use_grouped_topk", "false with num_expert_group > 1 is not supported")
        self._validate_linear_attn()

    def _validate_types(self) -> None:
        for name in _POSITIVE_INTS:
            _check_int(name, getattr(self, name), 1)
        for name in _NON_NEGATIVE_INTS:
            _check_int(name, getattr(self, name), 0)
        for name in _OPTIONAL_POSITIVE_INTS:
            value = getattr(self, name)
            if value is not None and (not _is_int(value) or not 0 < value <= _MAX_INT):
                _fail(name, f"must be a positive integer <= {_MAX_INT} when set, got {value!r}")
        for name in _OPTIONAL_TOKEN_IDS:
            value = getattr(self, name)
            if value is not None and (not _is_int(value) or not 0 <= value <= _MAX_INT):
                _fail(name, f"must be a non-negative integer <= {_MAX_INT} when set, got {value!r}")
        eos = self.eos_token_id
        eos_ids = eos if isinstance(eos, list) and eos else [eos]
        if eos is not None and not all(_is_int(i) and 0 <= i <= _MAX_INT for i in eos_ids):
            _fail("eos_token_id", f"must be a token id or a non-empty list of them, got {eos!r}")
        for name in _BOOLS:
            if not isinstance(getattr(self, name), bool):
                _fail(name, f"must be true or false, got {getattr(self, name)!r}")
        for name in _POSITIVE_FLOATS:
            value = getattr(self, name)
            if not _is_number(value) or not value > 0:
                _fail(name, f"must be a positive number, got {value!r}")
        for name in _OPTIONAL_FLOATS:
            value = getattr(self, name)
            if value is not None and not _is_number(value):
                _fail(name, f"must be a number when set, got {value!r}")
        for name in _STRINGS:
            if not isinstance(getattr(self, name), str):
                _fail(name, f"must be a string, got {getattr(self, name)!r}")

    def _validate_linear_attn(self) -> None:
        lac = self.linear_attn_config
        if not isinstance(lac, dict):
            _fail("linear_attn_config", "must be an object")
        unknown = set(lac) - _LINEAR_ATTN_KEYS
        if unknown:
            _fail("linear_attn_config", f"unknown keys {sorted(unknown)}")
        for key in ("kda_layers", "full_attn_layers", "num_heads", "head_dim"):
            if lac.get(key) is None:
                _fail(f"linear_attn_config.{key}", "is required")
        for key in ("kda_layers", "full_attn_layers"):
            if not isinstance(lac[key], list) or not all(_is_int(i) for i in lac[key]):
                _fail(f"linear_attn_config.{key}", f"must be a list of integers, got {lac[key]!r}")
        for key in ("num_heads", "head_dim"):
            _check_int(f"linear_attn_config.{key}", lac[key], 1)
        head_dim = lac["head_dim"]
        if head_dim & (head_dim - 1) or head_dim > _MAX_KDA_HEAD_DIM:
            # the fused decode kernel tiles head_dim as one power-of-two block
            _fail(
                "linear_attn_config.head_dim",
                f"must be a power of two <= {_MAX_KDA_HEAD_DIM}, got {head_dim}",
            )
        if "short_conv_kernel_size" in lac:
            width = lac["short_conv_kernel_size"]
            _check_int("linear_attn_config.short_conv_kernel_size", width, 1)
            if not _CONV_WIDTHS[0] <= width <= _CONV_WIDTHS[1]:
                _fail(
                    "linear_attn_config.short_conv_kernel_size",
                    f"must be in [{_CONV_WIDTHS[0]}, {_CONV_WIDTHS[1]}] (the conv kernels' "
                    f"widths), got {width}",
                )
        if not isinstance(lac.get("use_full_rank_gate", False), bool):
            _fail(
                "linear_attn_config.use_full_rank_gate",
                f"must be true or false, got {lac['use_full_rank_gate']!r}",
            )
        layers = range(1, self.num_hidden_layers + 1)
        for key in ("kda_layers", "full_attn_layers"):
            bad = [i for i in lac[key] if i not in layers]
            if bad:
                _fail(f"linear_attn_config.{key}", f"1-based layer numbers {bad} out of range")
        both = set(lac["kda_layers"]) & set(lac["full_attn_layers"])
        if both:
            _fail("linear_attn_config.kda_layers", f"layers {sorted(both)} are also full-attention")
        unlisted = set(layers) - set(lac["kda_layers"]) - set(lac["full_attn_layers"])
        if unlisted:
            _fail(
                "linear_attn_config.full_attn_layers",
                f"layers {sorted(unlisted)} are in neither list",
            )
        lower = lac.get("gate_lower_bound")
        if lower is not None and (not _is_number(lower) or not -5.0 <= lower < 0.0):
            _fail("linear_attn_config.gate_lower_bound", f"must be in [-5, 0), got {lower!r}")
        if lac["full_attn_layers"]:
            # The MLA cache keeps the latent and the rope part side by side in one row.
            if self.qk_rope_head_dim < 1:
                _fail("qk_rope_head_dim", "must be >= 1 with MLA layers (the cache's rope part)")
            row = self.kv_lora_rank + self.qk_rope_head_dim
            if row > _MAX_MLA_CACHE_ROW:
                _fail(
                    "kv_lora_rank",
                    f"kv_lora_rank + qk_rope_head_dim must be <= {_MAX_MLA_CACHE_ROW} (the MLA "
                    f"cache row), got {row}",
                )


def load_model_config(
    path: "str | Path", warn_checkpoint_quantization: bool = False
) -> "KimiLinearConfig | KimiK3Config":  # noqa: F821
    """Read `config.json` in a checkpoint folder: a `kimi_linear` or a `kimi_k3` config. With
    `warn_checkpoint_quantization` (once per engine: its arguments' check), a checkpoint's own
    `quantization_config` is logged as a warning (module docstring)."""
    from vllm.transformers_utils.configs.kimi_k3 import KimiK3Config

    file = Path(path) / "config.json" if Path(path).is_dir() else Path(path)
    try:
        config = json.loads(file.read_text())
    # UnicodeDecodeError (a binary or non-UTF-8 file) is a ValueError that names no file.
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"cannot read model config {file}: {e}") from None
    if not isinstance(config, dict):
        raise ValueError(f"model config {file} must be a JSON object, got {type(config).__name__}")
    if warn_checkpoint_quantization:
        _warn_checkpoint_quantization(file, config)
    model_type = config.get("model_type")
    if model_type == "kimi_linear":
        return KimiLinearConfig.from_dict(config)
    if model_type == "kimi_k3":
        return KimiK3Config.from_dict(config)
    raise ValueError(f"config field 'model_type': {model_type!r} is not kimi_linear or kimi_k3")


def _warn_checkpoint_quantization(file: Path, config: dict) -> None:
    text = config.get("text_config")
    quant = config.get("quantization_config")
    if quant is None and isinstance(text, dict):
        quant = text.get("quantization_config")
    if quant is None:
        return
    method = quant.get("quant_method") if isinstance(quant, dict) else None
    logger.warning(
        "%s has a quantization_config (quant_method %r), which this fork does not read: the model "
        "is built unquantized (dummy weights run in the model dtype), and loading the checkpoint's "
        "quantized tensors is refused; --quantization-config quantizes a bf16 checkpoint online",
        file, method,
    )  # fmt: skip
