"""Kimi-K3 / Kimi-Linear text model: decoder layers and `KimiLinearForCausalLM` (the dense MLP and
the MoE block are in `moe.py`, the attentions in `kda.py` and `mla.py`).

Checkpoint names (upstream-facts D.7): `mlp.gate_proj/up_proj/down_proj`;
`block_sparse_moe.gate.weight`, `.gate.e_score_correction_bias`, `.experts.{e}.w1/w2/w3`,
`.shared_experts.gate_proj/up_proj/down_proj`, `.routed_expert_down_proj`, `.routed_expert_norm`,
`.routed_expert_up_proj` (the MLP and MoE block load their own); with Kimi-K3's block attention
residuals when `attn_res_block_size` is set (`attn_res.py`): per layer
`self_attention_res_norm/_proj`, `mlp_res_norm/_proj`, and model-level `output_attn_res_norm/_proj`.
"""

import re
from collections.abc import Iterable

import torch

from vllm.logger import init_logger
from vllm.model_executor.layers.layernorm import RMSNorm
from vllm.model_executor.layers.linear import (
    ReplicatedLinear,
)
from vllm.model_executor.layers.quantization.base_config import QuantizationConfig
from vllm.model_executor.layers.vocab_parallel_embedding import (
    ParallelLMHead,
    VocabParallelEmbedding,
)
from vllm.model_executor.model_loader.weight_utils import (
    check_floating,
    copy_checked,
    tensor_digest,
)
from vllm.models.kimi_k3.amd.attn_res import AttnResState
from vllm.models.kimi_k3.amd.checkpoint_names import text_checkpoint_tensors
from vllm.models.kimi_k3.amd.kda import KDAStatePool, KimiK3DeltaAttention
from vllm.models.kimi_k3.amd.metadata import KimiMetadata
from vllm.models.kimi_k3.amd.mla import KimiMLAAttention
from vllm.models.kimi_k3.amd.moe import KimiMLP, KimiMoE
from vllm.models.kimi_k3.amd.ops.kda_prefill_graphs import (
    DEFAULT_SEQ_BUCKETS,
    DEFAULT_TOKEN_BUCKETS,
    CaptureProgress,
    KdaPrefillGraphs,
    buckets_within,
)
from vllm.transformers_utils.configs import KimiLinearConfig
from vllm.v1.kv_cache_interface import KDAStateSpec, KVCacheSpec, MLAAttentionSpec

logger = init_logger(__name__)

_LAYER = re.compile(r"model\.layers\.(\d+)\.([a-z_]+)\.(.+)")
_LAYER_NORMS = ("input_layernorm", "post_attention_layernorm")
_LAYER_ATTN_RES = (
    "self_attention_res_norm",
    "self_attention_res_proj",
    "mlp_res_norm",
    "mlp_res_proj",
)
_MODEL_ATTN_RES = ("model.output_attn_res_norm.weight", "model.output_attn_res_proj.weight")
_NO_ATTN_RES = "AttnRes weights, but the config sets no attn_res_block_size"
# The leading names of a MoE block's tensors (routed, router, shared) under `block_sparse_moe.`.
_MOE_TENSORS = ("experts.", "gate.", "shared_experts.")


def _attn_res_proj(
    hidden_size: int, params_dtype: torch.dtype | None, prefix: str
) -> ReplicatedLinear:
    """An AttnRes pseudo-query (weight `[1, hidden]`). Built without a quant config, as
    upstream: --quantization-config never applies to it."""
    return ReplicatedLinear(
        hidden_size, 1, bias=False, params_dtype=params_dtype, quant_config=None, prefix=prefix
    )


class KimiDecoderLayer(torch.nn.Module):
    """Pre-norm residual block: KDA or MLA attention, then a dense MLP or the MoE block.

    `forward` is the standard residual, the stream carried from layer to layer beside the
    sublayer output (as upstream's decoders do) so each add fuses into the next norm; with
    `attn_res_block_size` set the model calls `forward_attn_res` instead, whose sublayers read
    AttnRes mixtures (`attn_res.py`).
    """

    def __init__(
        self,
        config: KimiLinearConfig,
        layer_idx: int,
        params_dtype: torch.dtype | None = None,
        quant_config: QuantizationConfig | None = None,
        prefix: str = "",
    ) -> None:
        super().__init__()
        self.layer_idx = layer_idx
        self.is_kda = config.is_kda_layer(layer_idx)
        attn_prefix = f"{prefix}.self_attn"
        if self.is_kda:
            self.self_attn = KimiK3DeltaAttention(
                config.hidden_size, config.kda_num_heads, config.kda_head_dim,
                config.kda_conv_kernel_size, config.use_full_rank_gate, config.gate_lower_bound,
                config.rms_norm_eps, params_dtype, quant_config, attn_prefix,
            )  # fmt: skip
        else:
            self.self_attn = KimiMLAAttention(config, params_dtype, quant_config, attn_prefix)
        self.is_moe = config.is_moe_layer(layer_idx)
        if self.is_moe:
            self.block_sparse_moe = KimiMoE(
                config, params_dtype, quant_config, f"{prefix}.block_sparse_moe"
            )
        else:
            self.mlp = KimiMLP(
                config, config.intermediate_size, params_dtype=params_dtype,
                quant_config=quant_config, prefix=f"{prefix}.mlp",
            )  # fmt: skip
        eps = config.rms_norm_eps
        self.input_layernorm = RMSNorm(config.hidden_size, eps, params_dtype)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, eps, params_dtype)
        self.has_attn_res = config.attn_res_block_size is not None
        if self.has_attn_res:
            h = config.hidden_size
            self.self_attention_res_norm = RMSNorm(h, eps, params_dtype)
            self.self_attention_res_proj = _attn_res_proj(
                h, params_dtype, f"{prefix}.self_attention_res_proj"
            )
            self.mlp_res_norm = RMSNorm(h, eps, params_dtype)
            self.mlp_res_proj = _attn_res_proj(h, params_dtype, f"{prefix}.mlp_res_proj")

    def _attention(self, h: torch.Tensor, metadata: KimiMetadata) -> torch.Tensor:
        return self.self_attn(h, metadata.kda if self.is_kda else metadata.mla)

    def _ffn(self, h: torch.Tensor) -> torch.Tensor:
        return (self.block_sparse_moe if self.is_moe else self.mlp)(h)

    def forward(
        self, x: torch.Tensor, residual: torch.Tensor | None, metadata: KimiMetadata
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """`(ffn output, residual stream)`; the caller adds the two in the next norm.

        `x` is the previous layer's FFN output and `residual` its stream (None for the first
        layer, whose `x` is the embeddings). Each residual add is fused into the norm after it:
        the stream's values are those of `x + sublayer(norm(x))` computed step by step. A MoE
        layer hands its post-attention norm to the MoE block (`KimiMoE.forward_with_norm`),
        which at decode sizes runs it inside the router's launch; a KDA layer takes its input
        norm likewise (`KimiK3DeltaAttention.forward_with_norm`: inside its input projection's
        launch at one row, where that launch allows it, `use_rms_norm_gemv`).
        """
        if self.is_kda:
            out, residual = self.self_attn.forward_with_norm(
                x, residual, self.input_layernorm, metadata.kda
            )
        else:
            if residual is None:
                residual = x
                h = self.input_layernorm(x)
            else:
                h, residual = self.input_layernorm(x, residual)
            out = self._attention(h, metadata)
        if self.is_moe:
            return self.block_sparse_moe.forward_with_norm(
                out, residual, self.post_attention_layernorm
            )
        h, residual = self.post_attention_layernorm(out, residual)
        return self.mlp(h), residual

    def forward_attn_res(self, state: AttnResState, metadata: KimiMetadata) -> None:
        """Run the layer on the AttnRes stream `state`, adding both sublayer outputs to it."""
        state.begin_layer(self.layer_idx)
        h = state.mix(self.self_attention_res_norm, self.self_attention_res_proj)
        state.add(self._attention(self.input_layernorm(h), metadata))
        h = state.mix(self.mlp_res_norm, self.mlp_res_proj)
        state.add(self._ffn(self.post_attention_layernorm(h)))


class KimiLinearForCausalLM(torch.nn.Module):
    """The Kimi-Linear / Kimi-K3 text model: embeddings, decoder layers, final norm, LM head.

    Embeddings and the LM head are sharded over the vocabulary across TP ranks. With
    `attn_res_block_size` set the layers run on an AttnRes stream and a model-level mixture
    (`output_attn_res_norm/_proj`) feeds the final norm.
    """

    # fused layer -> the checkpoint modules it holds (for `re:` ignore rules on fused layers)
    packed_modules_mapping: dict[str, list[str]] = {
        "in_proj_qkvgfab": [
            "q_proj",
            "k_proj",
            "v_proj",
            "g_proj",
            "f_a_proj",
            "g_a_proj",
            "b_proj",
        ],
        "fused_qkv_a_proj": ["q_a_proj", "kv_a_proj_with_mqa", "g_proj"],
        "fused_q_kv_a_proj": ["q_proj", "kv_a_proj_with_mqa", "g_proj"],
        "gate_up_proj": ["gate_proj", "up_proj"],
    }

    def __init__(
        self,
        config: KimiLinearConfig,
        params_dtype: torch.dtype | None = None,
        quant_config: QuantizationConfig | None = None,
        prefix: str = "model",
    ) -> None:
        super().__init__()
        self.config = config
        dtype = params_dtype or torch.get_default_dtype()
        self.embed_tokens = VocabParallelEmbedding(
            config.vocab_size, config.hidden_size, dtype, f"{prefix}.embed_tokens"
        )
        self.layers = torch.nn.ModuleList(
            KimiDecoderLayer(config, i, dtype, quant_config, f"{prefix}.layers.{i}")
            for i in range(config.num_hidden_layers)
        )
        if config.attn_res_block_size is not None:
            self.output_attn_res_norm = RMSNorm(config.hidden_size, config.rms_norm_eps, dtype)
            self.output_attn_res_proj = _attn_res_proj(
                config.hidden_size, dtype, f"{prefix}.output_attn_res_proj"
            )
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps, dtype)
        # A tied head computes with the embedding's (identically sharded) weight.
        self.lm_head = ParallelLMHead(config.vocab_size, config.hidden_size, dtype, "lm_head")
        if config.tie_word_embeddings:
            self.lm_head.weight = self.embed_tokens.weight

    @staticmethod
    def checkpoint_tensors(config: KimiLinearConfig) -> dict[str, tuple[int, ...]]:
        """Every checkpoint tensor `config` implies: canonical name -> full (unsharded) shape, in
        checkpoint order (see `checkpoint_names`)."""
        return text_checkpoint_tensors(config)

    def forward(self, input_ids: torch.Tensor, metadata: KimiMetadata) -> torch.Tensor:
        """Hidden states `[T, hidden]` of the flattened batch (`[0, hidden]` for no tokens), on
        the caches bound by `bind_kv_caches`."""
        x = self.embed_tokens(input_ids)
        if x.shape[0] == 0:
            return x
        block_size = self.config.attn_res_block_size
        if block_size is None:
            residual = None
            for layer in self.layers:
                x, residual = layer(x, residual, metadata)
            return self.norm(x, residual)[0]  # the config has at least one layer
        state = AttnResState(x, len(self.layers), block_size)
        for layer in self.layers:
            layer.forward_attn_res(state, metadata)
        return self.norm(state.mix(self.output_attn_res_norm, self.output_attn_res_proj))

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm_head.compute_logits(hidden)

    def capture_prefill_graphs(
        self, max_tokens: int, max_seqs: int, progress: CaptureProgress = iter
    ) -> KdaPrefillGraphs | None:
        """Capture the KDA prefill core's graphs (`KdaPrefillGraphs`, walking its bucket pairs
        through `progress`) for steps of up to `max_tokens` prefill tokens in `max_seqs`
        sequences, and hand them to every KDA layer. Returns them (None: no KDA layer, or KDA
        layers of different shapes, which stay eager with a warning)."""
        kda = [
            layer.self_attn for layer in self.layers
            if isinstance(layer.self_attn, KimiK3DeltaAttention)
        ]  # fmt: skip
        shapes = {(a.local_heads, a.head_dim, a.gate_lower_bound) for a in kda}
        if len(shapes) != 1:
            if shapes:
                logger.warning("KDA layers of several shapes %s: no prefill graphs", shapes)
            return None
        ((heads, head_dim, lower_bound),) = shapes
        tokens = buckets_within(DEFAULT_TOKEN_BUCKETS, max_tokens)
        seqs = buckets_within(DEFAULT_SEQ_BUCKETS, max_seqs)
        weight = self.embed_tokens.weight
        graphs = KdaPrefillGraphs(
            heads, head_dim, weight.dtype, weight.device, lower_bound, tokens, seqs
        )
        graphs.capture(progress)
        for attn in kda:
            attn.prefill_graphs = graphs
        return graphs

    # -- caches ---------------------------------------------------------------------------------

    def get_kv_cache_spec(self) -> dict[int, KVCacheSpec]:
        """Layer index -> this rank's cache spec, in the model dtype (the embedding's)."""
        dtype = self.embed_tokens.weight.dtype
        return {i: layer.self_attn.get_kv_cache_spec(dtype) for i, layer in enumerate(self.layers)}

    def bind_kv_caches(
        self, kda_pools: dict[int, KDAStatePool], mla_caches: dict[int, torch.Tensor]
    ) -> None:
        """Bind each layer's cache to it, once (checked against `get_kv_cache_spec`): a KDA
        layer's state pool, an MLA layer's paged latent cache. Rebinding replaces them; two
        empty dicts release them (after a profiling run on throw-away caches)."""
        if not kda_pools and not mla_caches:
            for layer in self.layers:
                layer.self_attn.release_kv_cache()
            return
        spec = self.get_kv_cache_spec()
        kda = {i for i, s in spec.items() if isinstance(s, KDAStateSpec)}
        if set(kda_pools) != kda:
            raise ValueError(f"kda_pools has layers {sorted(kda_pools)}, the model {sorted(kda)}")
        if set(mla_caches) != set(spec) - kda:
            raise ValueError(
                f"mla_caches has layers {sorted(mla_caches)}, the model {sorted(set(spec) - kda)}"
            )
        device = self.embed_tokens.weight.device
        for i, pool in kda_pools.items():
            if pool.conv_state.dtype != spec[i].conv_dtype or pool.conv_state.device != device:
                raise ValueError(
                    f"kda_pools[{i}]: conv state {pool.conv_state.dtype} on "
                    f"{pool.conv_state.device}, expected {spec[i].conv_dtype} on {device}"
                )
            self.layers[i].self_attn.bind_kv_cache(pool)
        for i, cache in mla_caches.items():
            layer_spec: MLAAttentionSpec = spec[i]
            if cache.dtype != layer_spec.dtype or cache.device != device:
                raise ValueError(
                    f"mla_caches[{i}]: {cache.dtype} on {cache.device}, expected "
                    f"{layer_spec.dtype} on {device}"
                )
            self.layers[i].self_attn.bind_kv_cache(cache)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        """Load Hugging Face checkpoint tensors (`model.layers.{i}....`, `lm_head.weight`); the
        AttnRes ones only when `attn_res_block_size` is set.

        Each tensor is dispatched as it arrives (nothing is held back), so a streamed checkpoint
        needs host memory for one tensor only. Raises ValueError naming an unexpected tensor or one
        that is not 16-bit-or-wider floating point, and, with tied embeddings, for a saved
        `lm_head.weight` that is not a copy of the embedding (compared by digest); returns the
        canonical names loaded (`checkpoint_tensors`): transformers' `block_sparse_moe.*`
        spelling of a dense MLP is reported as `mlp.*`."""
        loaded = set()
        tied = self.config.tie_word_embeddings
        digests = {}  # tied: the embedding's and the saved head's, which must be one tensor
        for name, tensor in weights:
            match = _LAYER.fullmatch(name)
            if match:
                i = int(match[1])
                if i >= len(self.layers) + self.config.num_nextn_predict_layers:
                    raise ValueError(f"unexpected checkpoint tensor {name!r}: no layer {i}")
                if i >= len(self.layers):
                    continue  # multi-token-prediction layers: not served, whatever their dtype
                check_floating(tensor, name)
                name = self._load_layer_tensor(i, match[2], match[3], tensor)
                loaded.add(name)
                continue
            check_floating(tensor, name)
            if name == "model.embed_tokens.weight":
                self.embed_tokens.weight_loader(self.embed_tokens.weight, tensor)
                if tied:
                    digests[name] = tensor_digest(tensor)
            elif name == "model.norm.weight":
                copy_checked(self.norm.weight, tensor, name)
            elif name in _MODEL_ATTN_RES and self.config.attn_res_block_size is not None:
                # a norm or an unquantized replicated projection: the whole weight on every rank
                copy_checked(getattr(self, name.split(".")[1]).weight, tensor, name)
            elif name == "lm_head.weight":
                if tied:  # the head is the embedding: a saved copy is skipped once compared
                    digests[name] = tensor_digest(tensor)
                else:
                    self.lm_head.weight_loader(self.lm_head.weight, tensor)
            elif name in _MODEL_ATTN_RES:
                raise ValueError(f"unexpected checkpoint tensor {name!r}: {_NO_ATTN_RES}")
            else:
                raise ValueError(f"unexpected checkpoint tensor {name!r}")
            if len(set(digests.values())) > 1:
                # transformers' KimiLinear saves and uses its own head even with the flag set.
                raise ValueError(
                    "the config ties the LM head to the embedding (tie_word_embeddings true), "
                    "but the checkpoint's lm_head.weight differs from model.embed_tokens.weight; "
                    "set tie_word_embeddings (Kimi-K3: text_config's) to false to load its head"
                )
            loaded.add(name)
        return loaded

    def _load_layer_tensor(self, i: int, part: str, rest: str, tensor: torch.Tensor) -> str:
        """Load `model.layers.{i}.{part}.{rest}`; returns its canonical name."""
        layer = self.layers[i]
        name = f"model.layers.{i}.{part}.{rest}"
        if part in _LAYER_NORMS or (part in _LAYER_ATTN_RES and layer.has_attn_res):
            if rest != "weight":
                raise ValueError(f"unexpected checkpoint tensor {name!r}")
            copy_checked(getattr(layer, part).weight, tensor, name)
        elif part == "self_attn":
            layer.self_attn.load_weights([(rest, tensor)])
        elif part == "block_sparse_moe" and layer.is_moe:
            layer.block_sparse_moe.load_weights([(rest, tensor)])
        elif part in ("mlp", "block_sparse_moe") and not layer.is_moe:
            if rest.startswith(_MOE_TENSORS):
                c = self.config
                raise ValueError(
                    f"checkpoint tensor {name!r} is a MoE layer's, but the config makes layer {i} "
                    f"dense (first_k_dense_replace {c.first_k_dense_replace}, moe_layer_freq "
                    f"{c.moe_layer_freq})"
                )
            # transformers' save_pretrained names the dense MLP `block_sparse_moe.*` too
            layer.mlp.load_weight(rest, tensor)
            name = f"model.layers.{i}.mlp.{rest}"
        elif part in _LAYER_ATTN_RES:
            raise ValueError(f"unexpected checkpoint tensor {name!r}: {_NO_ATTN_RES}")
        else:
            raise ValueError(f"unexpected checkpoint tensors under model.layers.{i}.{part}")
        return name

    def process_weights_after_loading(self) -> None:
        """The one walk after loading: every submodule that defines `process_weights_after_loading`
        runs it once, children before their parents (reversed `modules()` order), so MLA derives
        its absorbed weights from a `kv_b_proj` its quant method has already processed; no
        submodule walks its own children."""
        for module in reversed(list(self.modules())):
            if module is not self and hasattr(module, "process_weights_after_loading"):
                module.process_weights_after_loading()
