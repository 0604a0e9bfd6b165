"""`KimiMLAAttention`: Kimi's NoPE multi-head latent attention with a paged latent KV cache.

Per token the cache keeps the compressed latent `[kv_lora_rank]` (after `kv_a_layernorm`) and the
shared `k_pe` `[qk_rope_head_dim]`, in blocks `[num_blocks, block_size, kv_lora_rank + rope]`
addressed through per-sequence block tables; `slot_mapping` says where each new token goes. There
is no rotary embedding (`mla_use_nope`, as upstream): the "rope" part of q and the shared `k_pe`
still take part in the dot product, with softmax scale `(qk_nope + qk_rope) ** -0.5`.

Projections (upstream-facts D.4): with `q_lora_rank` (Kimi-K3) `fused_qkv_a_proj` holds
`[q_a (replicated) | kv_a (replicated) | output gate (TP-sharded, if any)]`, then `q_a_layernorm`
and `q_b_proj`; without it (Kimi-Linear) `q_proj`, `kv_a_proj_with_mqa` and an optional `g_proj`.
`kv_b_proj` expands latents to per-head `k_nope` and `v`; with `mla_use_output_gate` the attention
output is multiplied by `sigmoid(gate)` before `o_proj`.

Attention is plain torch (decompress the sequence's cached latents, masked softmax): correct first;
MLA's own kernels are a later step.
"""

from collections.abc import Iterable
from dataclasses import dataclass, field

import torch

from vllm.distributed import get_tensor_model_parallel_world_size
from vllm.model_executor.layers.layernorm import RMSNorm
from vllm.model_executor.layers.linear import (
    ColumnParallelLinear,
    MergedColumnParallelLinear,
    ReplicatedLinear,
    RowParallelLinear,
)
from vllm.model_executor.layers.quantization.base_config import QuantizationConfig
from vllm.transformers_utils.configs import KimiLinearConfig


@dataclass
class MLAMetadata:
    """The flattened batch as MLA sees it (any order of sequences)."""

    query_start_loc: list[int]  # [N + 1]: this step's tokens of each sequence
    seq_lens: list[int]  # [N]: context length of each sequence including this step's tokens
    block_tables: torch.Tensor  # [N, max_blocks] int: cache blocks of each sequence, in order
    slot_mapping: torch.Tensor  # [T] long: cache slot (block * block_size + offset) of each token
    # No padding entries (-1): slots and block tables index the cache unchecked.
    _contexts: dict[int, list] = field(default_factory=dict, init=False, repr=False, compare=False)

    def contexts(self, block_size: int) -> list[tuple[int, int, torch.Tensor, torch.Tensor]]:
        """`(start, end, slots, masked)` of each sequence with tokens this step: the cache slots
        `[ctx]` of its context in order and the causal mask `[end - start, ctx]` (True above the
        diagonal). The same for every MLA layer of a forward, so built by the first one."""
        if block_size not in self._contexts:
            device = self.block_tables.device
            out = []
            qsl = self.query_start_loc
            for i, ctx in enumerate(self.seq_lens):
                start, end = qsl[i], qsl[i + 1]
                if end == start:
                    continue
                positions = torch.arange(ctx, device=device)
                slots = self.block_tables[i][positions // block_size] * block_size
                query_pos = positions[ctx - (end - start) :]
                masked = positions[None, :] > query_pos[:, None]
                out.append((start, end, slots + positions % block_size, masked))
            self._contexts[block_size] = out
        return self._contexts[block_size]


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
        if self.q_lora:
            sizes = [self.q_lora, self.kv_lora + self.rope] + (
                [heads * self.v_dim] if self.use_gate else []
            )
            self.fused_qkv_a_proj = MergedColumnParallelLinear(
                h, sizes, prefix=f"{prefix}.fused_qkv_a_proj",
                replicated_shards=frozenset({0, 1}), **common,
            )  # fmt: skip
            self.q_a_layernorm = RMSNorm(
                self.q_lora, config.rms_norm_eps, params_dtype, f"{prefix}.q_a_layernorm"
            )
            self.q_b_proj = ColumnParallelLinear(
                self.q_lora, heads * qk, prefix=f"{prefix}.q_b_proj", **common
            )
        else:
            self.q_proj = ColumnParallelLinear(h, heads * qk, prefix=f"{prefix}.q_proj", **common)
            self.kv_a_proj_with_mqa = ReplicatedLinear(
                h, self.kv_lora + self.rope, prefix=f"{prefix}.kv_a_proj_with_mqa", **common
            )
            if self.use_gate:
                self.g_proj = ColumnParallelLinear(
                    h, heads * self.v_dim, prefix=f"{prefix}.g_proj", **common
                )
        self.kv_a_layernorm = RMSNorm(
            self.kv_lora, config.rms_norm_eps, params_dtype, f"{prefix}.kv_a_layernorm"
        )
        self.kv_b_proj = ColumnParallelLinear(
            self.kv_lora, heads * (self.nope + self.v_dim), prefix=f"{prefix}.kv_b_proj", **common
        )
        self.o_proj = RowParallelLinear(heads * self.v_dim, h, prefix=f"{prefix}.o_proj", **common)

    def forward(
        self, x: torch.Tensor, metadata: MLAMetadata, kv_cache: torch.Tensor
    ) -> torch.Tensor:
        tokens = x.shape[0]
        gate = None
        if self.q_lora:
            a = self.fused_qkv_a_proj(x)[0]
            q_a, kv_a = (
                a[:, : self.q_lora],
                a[:, self.q_lora : self.q_lora + self.kv_lora + self.rope],
            )
            if self.use_gate:
                gate = a[:, self.q_lora + self.kv_lora + self.rope :]
            q = self.q_b_proj(self.q_a_layernorm(q_a))[0]
        else:
            q = self.q_proj(x)[0]
            kv_a = self.kv_a_proj_with_mqa(x)[0]
            if self.use_gate:
                gate = self.g_proj(x)[0]
        q = q.view(tokens, self.heads, self.nope + self.rope)
        latent = torch.cat(
            [self.kv_a_layernorm(kv_a[:, : self.kv_lora]), kv_a[:, self.kv_lora :]], -1
        )
        flat_cache = kv_cache.view(-1, kv_cache.shape[-1])
        flat_cache[metadata.slot_mapping] = latent.to(kv_cache.dtype)

        out = torch.empty(tokens, self.heads, self.v_dim, dtype=x.dtype, device=x.device)
        for a, b, slots, masked in metadata.contexts(kv_cache.shape[1]):
            out[a:b] = self._attend(q[a:b], flat_cache[slots], masked)
        if gate is not None:
            out = out * torch.sigmoid(gate.view(tokens, self.heads, self.v_dim).float()).to(
                out.dtype
            )
        return self.o_proj(out.reshape(tokens, -1))[0]

    def _attend(self, q: torch.Tensor, cached: torch.Tensor, masked: torch.Tensor) -> torch.Tensor:
        """`q` `[Lq, h, nope + rope]` of the last Lq positions of a sequence whose `ctx` cached
        latents are `cached`; `masked` `[Lq, ctx]` is its causal mask."""
        kv = self.kv_b_proj(cached[:, : self.kv_lora].to(q.dtype))[0]
        kv = kv.view(cached.shape[0], self.heads, self.nope + self.v_dim).float()
        k_nope, v = kv[..., : self.nope], kv[..., self.nope :]
        k_pe = cached[:, self.kv_lora :].float()  # [ctx, rope], shared by the heads
        qf = q.float()
        scores = torch.einsum("qhd,khd->hqk", qf[..., : self.nope], k_nope)
        scores += torch.einsum("qhd,kd->hqk", qf[..., self.nope :], k_pe)
        probs = (scores * self.scale).masked_fill(masked, float("-inf")).softmax(dim=-1)
        return torch.einsum("hqk,khd->qhd", probs, v).to(q.dtype)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        """Checkpoint tensors named relative to `self_attn.`; raises on an unknown name."""
        shards = {"q_a_proj": 0, "kv_a_proj_with_mqa": 1, "g_proj": 2} if self.q_lora else {}
        loaded = set()
        for name, tensor in weights:
            module = name.removesuffix(".weight")
            if module in shards:
                p = self.fused_qkv_a_proj.weight
                self.fused_qkv_a_proj.weight_loader(p, tensor, shards[module])
            elif hasattr(self, module) and isinstance(getattr(self, module), torch.nn.Module):
                layer = getattr(self, module)
                layer.weight_loader(layer.weight, tensor)
            else:
                raise ValueError(f"{self.prefix}: unexpected checkpoint tensor {name!r}")
            loaded.add(name)
        return loaded
