"""`KimiMLAAttention`: Kimi's NoPE multi-head latent attention with a paged latent KV cache.

Per token the cache keeps the compressed latent `[kv_lora_rank]` (after `kv_a_layernorm`) and the
shared `k_pe` `[qk_rope_head_dim]`, in blocks `[num_blocks, block_size, kv_lora_rank + rope]`
addressed through per-sequence block tables; `slot_mapping` says where each new token goes. There
is no rotary embedding (`mla_use_nope`, as upstream): the "rope" part of q and the shared `k_pe`
still take part in the dot product, with softmax scale `(qk_nope + qk_rope) ** -0.5`.

Projections (upstream-facts D.4): x goes through one merged projection. With `q_lora_rank`
(Kimi-K3) `fused_qkv_a_proj` holds `[q_a (replicated) | kv_a (replicated) | output gate
(TP-sharded, if any)]`, then `q_a_layernorm` and `q_b_proj`; without it (Kimi-Linear)
`fused_q_kv_a_proj` holds `[q (TP-sharded) | kv_a (replicated) | gate (if any)]`, loaded from the
checkpoint's `q_proj`, `kv_a_proj_with_mqa` and `g_proj` (the model's `packed_modules_mapping`
names them for `--quantization-config` ignore rules). `kv_b_proj` expands latents to per-head
`k_nope` and `v`; with `mla_use_output_gate` the attention output is multiplied by
`sigmoid(gate)` before `o_proj`.

Cache write: `ops/mla_cache_write.py` norms kv_a's latent with `kv_a_layernorm`, appends `k_pe`
and writes each token's entry at its slot, in one launch (bit-identical to the separate norm, cat
and indexed write it replaces for kv_a rows aligned alike, as the projection's output rows are;
see that module).

Attention, decodes first like KDA (`MLAMetadata`):
- decode rows run in the weight-absorbed form over the paged cache: `q_latent = q_nope @ W_UK` per
  head, `mla_decode_paged` (a Triton kernel on GPU, the torch reference on CPU) with the block
  tables and lengths as device tensors, then `o_latent @ W_UV` per head, written straight into
  the output rows (no copy). Both per-head products take the batched GEMV
  (`vllm/model_executor/kernels/linear/gemv.py`) up to `BATCHED_GEMV_MAX_M` sequences, torch.bmm
  above. `W_UK` / `W_UV` are `kv_b_proj`'s (dequantized) weight split per head, `[h, out, in]`,
  derived once in `process_weights_after_loading`. The layer owns the kernel's
  arrival counters (`decode_counters`), so the launches whose splits are few (2 splits of 32
  heads: batches of about 45-66 sequences on an H200) merge them in the same launch. No
  host sync and no loop over sequences: capturable.
- prefill rows (new prompts and prefill chunks on top of cached context) take the exact path:
  decompress each sequence's cached latents through `kv_b_proj` (in the model dtype), then
  `ops/mla_prefill.py`: torch's fused attention in the model dtype on GPU (no score matrix; the
  key built in one launch; the kernel chosen by shape), the masked fp32 softmax reference on
  CPU. Each sequence's output is copied into the layer's output rows, except
  in a batch that is one prefill with a PTPC FP8 `o_proj` and no output gate (Kimi-Linear; a
  long prompt): there `o_proj`'s
  per-token quantization reads the attention output in place (`per_token_fp8_quant` of its
  `[T, H, v]` view), which gives the codes of the copy.
"""

from collections.abc import Iterable
from dataclasses import dataclass

import torch

from vllm.distributed import get_tensor_model_parallel_world_size
from vllm.model_executor.kernels.linear.gemv import gemv_batched
from vllm.model_executor.kernels.linear.gemv_config import use_batched_gemv
from vllm.model_executor.layers.fusion.quant_activation import (
    QuantizedActivation,
    get_input_quant_key,
)
from vllm.model_executor.layers.layernorm import RMSNorm
from vllm.model_executor.layers.linear import (
    ColumnParallelLinear,
    MergedColumnParallelLinear,
    RowParallelLinear,
)
from vllm.model_executor.layers.quantization.base_config import QuantizationConfig
from vllm.model_executor.layers.quantization.utils.fp8_per_token import per_token_fp8_quant
from vllm.model_executor.layers.quantization.utils.quant_utils import kFp8DynamicTokenSym
from vllm.models.kimi_k3.amd.ops.mla_cache_write import mla_cache_write
from vllm.models.kimi_k3.amd.ops.mla_decode import mla_decode_paged
from vllm.models.kimi_k3.amd.ops.mla_decode_config import DECODE_COUNTERS
from vllm.models.kimi_k3.amd.ops.mla_prefill import (
    causal_masked,
    mla_prefill_attention,
    mla_prefill_attention_ref,
)
from vllm.transformers_utils.configs import KimiLinearConfig
from vllm.v1.kv_cache_interface import MLAAttentionSpec


def _per_head(
    x: torch.Tensor, weight: torch.Tensor, out: torch.Tensor | None = None
) -> torch.Tensor:
    """`x[h] @ weight[h]^T` per head: `x` `[h, Nd, in]`, `weight` `[h, out, in]` (the layer's
    absorbed `w_uk` / `w_uv`, made once at load: static, gemv.py); the batched GEMV for a few
    rows (it reads each head's weight once, with PDL), torch.bmm for more."""
    if use_batched_gemv(x, weight):
        return gemv_batched(x, weight, out=out, static_weight=True)
    return torch.bmm(x, weight.transpose(1, 2), out=out)


@dataclass
class MLAMetadata:
    """The flattened batch as MLA sees it, built by `KimiMetadataBuilder`: decodes first (one
    token each), then prefill chunks; every field is filled at build time.

    Padded decode rows (CUDA-graph batch sizes) use the reserved block 0: a table of zeros,
    length 1 and a slot in block 0, so they read and write only that dummy block.
    """

    num_decodes: int
    slot_mapping: torch.Tensor  # [T] long: cache slot (block * block_size + offset) of each token
    decode_block_tables: torch.Tensor  # [num_decodes, max_blocks] int32, on the device
    decode_seq_lens: torch.Tensor  # [num_decodes] int32: context length including the new token
    # Per prefill sequence: (start, end) of its tokens in the batch and the cache slots `[ctx]` of
    # its whole context in order (its last end - start positions are the new tokens).
    prefills: list[tuple[int, int, torch.Tensor]]


class KimiMLAAttention(torch.nn.Module):
    def __init__(
        self,
        config: KimiLinearConfig,
        params_dtype: torch.dtype | None = None,
        quant_config: QuantizationConfig | None = None,
        prefix: str = "",
    ) -> None:
        super().__init__()
        tp = get_tensor_model_parallel_world_size()
        if config.num_attention_heads % tp:
            raise ValueError(f"{prefix}: {config.num_attention_heads} heads do not split over {tp}")
        self.heads = config.num_attention_heads // tp
        self.nope, self.rope = config.qk_nope_head_dim, config.qk_rope_head_dim
        self.v_dim, self.kv_lora = config.v_head_dim, config.kv_lora_rank
        self.q_lora = config.q_lora_rank
        self.use_gate = config.mla_use_output_gate
        self.scale = (self.nope + self.rope) ** -0.5
        self.prefix = prefix
        h, heads = config.hidden_size, config.num_attention_heads
        qk = self.nope + self.rope
        common = dict(bias=False, params_dtype=params_dtype, quant_config=quant_config)
        # One projection of x: [q_a (replicated) or q (TP-sharded) | kv_a (replicated) | gate].
        sizes = [self.q_lora or heads * qk, self.kv_lora + self.rope]
        sizes += [heads * self.v_dim] if self.use_gate else []
        self.fused_a_name = "fused_qkv_a_proj" if self.q_lora else "fused_q_kv_a_proj"
        names = ["q_a_proj" if self.q_lora else "q_proj", "kv_a_proj_with_mqa", "g_proj"]
        names = names[: len(sizes)]
        fused = MergedColumnParallelLinear(
            h, sizes, prefix=f"{prefix}.{self.fused_a_name}",
            replicated_shards=frozenset({0, 1} if self.q_lora else {1}), shard_names=names,
            **common,
        )  # fmt: skip
        setattr(self, self.fused_a_name, fused)
        self.fused_a_sizes = list(fused.output_partition_sizes)
        # Checkpoint module -> its shard of the fused projection.
        self.fused_a_shards = {name: i for i, name in enumerate(names)}
        if self.q_lora:
            self.q_a_layernorm = RMSNorm(
                self.q_lora, config.rms_norm_eps, params_dtype, f"{prefix}.q_a_layernorm"
            )
            self.q_b_proj = ColumnParallelLinear(
                self.q_lora, heads * qk, prefix=f"{prefix}.q_b_proj", **common
            )
        self.kv_a_layernorm = RMSNorm(
            self.kv_lora, config.rms_norm_eps, params_dtype, f"{prefix}.kv_a_layernorm"
        )
        self.kv_b_proj = ColumnParallelLinear(
            self.kv_lora, heads * (self.nope + self.v_dim), prefix=f"{prefix}.kv_b_proj", **common
        )
        self.o_proj = RowParallelLinear(heads * self.v_dim, h, prefix=f"{prefix}.o_proj", **common)
        # Absorbed decode weights: W_UK `[H, nope, L]`, W_UV `[H, L, v]` (derived, not loaded).
        self.register_buffer("w_uk", None, persistent=False)
        self.register_buffer("w_uv", None, persistent=False)
        # The decode's arrival counters for its one-launch merge (ops/mla_decode.py): one set per
        # layer, so no two launches in flight share them; 0 between launches. Not loaded.
        self.register_buffer(
            "decode_counters", torch.zeros(DECODE_COUNTERS, dtype=torch.int32), persistent=False
        )
        self.kv_cache: torch.Tensor | None = None  # set once by `bind_kv_cache`

    # -- cache ----------------------------------------------------------------------------------

    def get_kv_cache_spec(self, dtype: torch.dtype) -> MLAAttentionSpec:
        """Per token: the normed latent and the shared `k_pe`, in `dtype` (the model's)."""
        return MLAAttentionSpec(entry_size=self.kv_lora + self.rope, dtype=dtype)

    def bind_kv_cache(self, kv_cache: torch.Tensor) -> None:
        """Keep `kv_cache` `[num_blocks, block_size, kv_lora_rank + rope]` as this layer's cache."""
        if kv_cache.dim() != 3 or kv_cache.shape[-1] != self.kv_lora + self.rope:
            raise ValueError(
                f"kv_cache of {self.prefix}: shape {tuple(kv_cache.shape)}, expected "
                f"[num_blocks, block_size, {self.kv_lora + self.rope}]"
            )
        self.kv_cache = kv_cache

    def release_kv_cache(self) -> None:
        self.kv_cache = None

    # -- weights --------------------------------------------------------------------------------

    def process_weights_after_loading(self) -> None:
        """Derive W_UK / W_UV from `kv_b_proj` as it computes (after its own quant method has
        processed it): its output for the identity is its dequantized weight transposed, whatever
        the quant method's layout. A PTPC FP8 method quantizes each identity row exactly (one
        nonzero of 1.0, scale 1/448: the code is 448, representable)."""
        dtype = self.kv_a_layernorm.weight.dtype
        eye = torch.eye(self.kv_lora, dtype=dtype, device=self.kv_a_layernorm.weight.device)
        with torch.no_grad():
            w = self.kv_b_proj(eye)[0].view(self.kv_lora, self.heads, self.nope + self.v_dim)
        # Both [h, out, in] with `in` contiguous: each head's weight as a GEMV reads it.
        self.w_uk = w[..., : self.nope].permute(1, 0, 2).contiguous()  # [h, L, nope]
        self.w_uv = w[..., self.nope :].permute(1, 2, 0).contiguous()  # [h, v, L]

    # -- forward --------------------------------------------------------------------------------

    def forward(self, x: torch.Tensor, metadata: MLAMetadata) -> torch.Tensor:
        kv_cache = self.kv_cache
        if kv_cache is None:
            raise RuntimeError(f"{self.prefix}: no kv cache bound (call bind_kv_cache first)")
        tokens = x.shape[0]
        parts = getattr(self, self.fused_a_name)(x)[0].split(self.fused_a_sizes, dim=-1)
        q, kv_a = parts[0], parts[1]  # column slices of the projection, read in place
        gate = parts[2] if self.use_gate else None
        if self.q_lora:
            q = self.q_b_proj(self.q_a_layernorm(q))[0]
        q = q.view(tokens, self.heads, self.nope + self.rope)
        norm = self.kv_a_layernorm
        mla_cache_write(kv_a, norm.weight, norm.eps, kv_cache, metadata.slot_mapping)

        nd = metadata.num_decodes
        flat_cache = kv_cache.view(-1, kv_cache.shape[-1])
        prefills = metadata.prefills
        whole = nd == 0 and len(prefills) == 1 and prefills[0][:2] == (0, tokens)
        if whole and gate is None and self._o_proj_is_ptpc_fp8():
            # The batch is one prefill (a long prompt): o_proj's per-token quantization reads the
            # attention's output where it lies (a view of the fused kernel's output), the
            # same codes as of a copy into `out`, without the copy.
            attn = self._attend(q, flat_cache[prefills[0][2]])
            codes, scale = per_token_fp8_quant(attn)
            width = self.heads * self.v_dim
            quantized = QuantizedActivation(
                codes, scale, x.dtype, torch.Size([tokens, width]), kFp8DynamicTokenSym
            )
            return self.o_proj(quantized)[0]
        out = torch.empty(tokens, self.heads, self.v_dim, dtype=x.dtype, device=x.device)
        if nd:
            self._decode(q[:nd], kv_cache, metadata, out[:nd])
        for a, b, slots in metadata.prefills:
            out[a:b] = self._attend(q[a:b], flat_cache[slots])
        if gate is not None:
            out = out * torch.sigmoid(gate.view(tokens, self.heads, self.v_dim).float()).to(
                out.dtype
            )
        return self.o_proj(out.reshape(tokens, -1))[0]

    def _o_proj_is_ptpc_fp8(self) -> bool:
        return get_input_quant_key(self.o_proj) == kFp8DynamicTokenSym

    def _decode(
        self, q: torch.Tensor, kv_cache: torch.Tensor, md: MLAMetadata, out: torch.Tensor
    ) -> None:
        """Absorbed form for one token per sequence: `q` `[Nd, h, nope + rope]` -> `out`
        `[Nd, h, v]` (contiguous rows of the layer's output)."""
        if self.w_uk is None:
            raise RuntimeError(f"{self.prefix}: process_weights_after_loading was not called")
        q_nope, q_pe = q[..., : self.nope], q[..., self.nope :]
        q_latent = _per_head(q_nope.transpose(0, 1), self.w_uk).transpose(0, 1)  # [Nd, h, L]
        o_latent = mla_decode_paged(
            q_latent, q_pe, kv_cache, md.decode_block_tables, md.decode_seq_lens, self.scale,
            self.decode_counters,
        )  # fmt: skip
        # Written through out's [h, Nd, v] view (both products take its strides as they are),
        # so it lands in the output rows with no copy after it.
        _per_head(o_latent.transpose(0, 1), self.w_uv, out=out.transpose(0, 1))

    def _attend(self, q: torch.Tensor, cached: torch.Tensor) -> torch.Tensor:
        """`q` `[Lq, h, nope + rope]` of the last Lq positions of a sequence whose `ctx` cached
        latents are `cached`, attending causally. The fused GPU path derives causality from the
        shapes; only the CPU reference takes a `[Lq, ctx]` mask, made here and nowhere else (on
        the device it would be Lq x ctx bytes a step: 1 GiB for an 8192-token chunk at 128k)."""
        kv = self.kv_b_proj(cached[:, : self.kv_lora].to(q.dtype))[0]
        kv = kv.view(cached.shape[0], self.heads, self.nope + self.v_dim)
        k_nope, v = kv[..., : self.nope], kv[..., self.nope :]
        k_pe = cached[:, self.kv_lora :].to(q.dtype)  # [ctx, rope], shared by the heads
        if q.is_cuda:
            return mla_prefill_attention(q, k_nope, k_pe, v, self.scale)
        masked = causal_masked(q.shape[0], cached.shape[0], q.device)
        return mla_prefill_attention_ref(q, k_nope, k_pe, v, self.scale, masked)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        """Checkpoint tensors named relative to `self_attn.`; raises on an unknown name."""
        fused = getattr(self, self.fused_a_name)
        loaded = set()
        for name, tensor in weights:
            module = name.removesuffix(".weight")
            if module in self.fused_a_shards:
                fused.weight_loader(fused.weight, tensor, self.fused_a_shards[module])
            elif hasattr(self, module) and isinstance(getattr(self, module), torch.nn.Module):
                layer = getattr(self, module)
                layer.weight_loader(layer.weight, tensor)
            else:
                raise ValueError(f"{self.prefix}: unexpected checkpoint tensor {name!r}")
            loaded.add(name)
        return loaded
