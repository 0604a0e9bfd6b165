"""MLA decode over the paged latent cache, in the weight-absorbed form.

One query token for each of N sequences, H local heads, latent width L (`kv_lora_rank`), shared
position part R (`qk_rope_head_dim`; unrotated here, MLA is NoPE):

- `q_latent` `[N, H, L]`: the query's nope part already multiplied into the latent space
  (`q_nope @ W_UK` per head), `q_pe` `[N, H, R]`;
- `kv_cache` `[num_blocks, block_size, L + R]`: per token the normed latent `c` and `k_pe`;
- `block_tables` `[N, max_blocks]` int32/int64 and `seq_lens` `[N]` int32/int64 on the device:
  sequence n attends to its first `seq_lens[n]` cached tokens, token p at
  `kv_cache[block_tables[n, p // block_size], p % block_size]`. Entries of `block_tables` past a
  sequence's length are never read. `seq_lens[n] >= 1`.

Output `[N, H, L]` in `q_latent`'s dtype: `sum_p softmax_p(scale * (q_latent . c_p + q_pe . k_pe_p))
* c_p`, computed in fp32; the caller maps it out of the latent space with `W_UV`.

Shapes are fixed by the buffers, not by the lengths, and nothing is read back to the host: the op
can be captured in a CUDA graph.
"""

import torch


def mla_decode_paged_ref(
    q_latent: torch.Tensor,
    q_pe: torch.Tensor,
    kv_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    """The torch reference: gathers every sequence's whole block table (masked past its length)."""
    n, _, latent = q_latent.shape
    block_size = kv_cache.shape[1]
    ctx = kv_cache[block_tables.long()].reshape(n, -1, kv_cache.shape[-1]).float()  # [N, P, L+R]
    scores = torch.einsum("nhl,npl->nhp", q_latent.float(), ctx[..., :latent])
    scores += torch.einsum("nhr,npr->nhp", q_pe.float(), ctx[..., latent:])
    positions = torch.arange(block_tables.shape[1] * block_size, device=q_latent.device)
    masked = positions[None, :] >= seq_lens.long()[:, None]  # [N, P]
    probs = (scores * scale).masked_fill(masked[:, None, :], float("-inf")).softmax(dim=-1)
    return torch.einsum("nhp,npl->nhl", probs, ctx[..., :latent]).to(q_latent.dtype)


def _validate(q_latent, q_pe, kv_cache, block_tables, seq_lens) -> None:
    if q_latent.dim() != 3 or q_pe.dim() != 3 or q_latent.shape[:2] != q_pe.shape[:2]:
        raise ValueError(
            f"q_latent {tuple(q_latent.shape)} and q_pe {tuple(q_pe.shape)} must be [N, H, L] and "
            "[N, H, R]"
        )
    if kv_cache.dim() != 3 or kv_cache.shape[-1] != q_latent.shape[-1] + q_pe.shape[-1]:
        raise ValueError(
            f"kv_cache {tuple(kv_cache.shape)} must be [blocks, block_size, L + R] with L + R = "
            f"{q_latent.shape[-1] + q_pe.shape[-1]}"
        )
    n = q_latent.shape[0]
    if block_tables.dim() != 2 or block_tables.shape[0] != n:
        raise ValueError(f"block_tables {tuple(block_tables.shape)} must be [N={n}, max_blocks]")
    if seq_lens.shape != (n,):
        raise ValueError(f"seq_lens {tuple(seq_lens.shape)} must be [N={n}]")
    for name, t in (("block_tables", block_tables), ("seq_lens", seq_lens)):
        if t.dtype not in (torch.int32, torch.int64):
            raise ValueError(f"{name} must be int32 or int64, got {t.dtype}")


def mla_decode_paged(
    q_latent: torch.Tensor,
    q_pe: torch.Tensor,
    kv_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    """Absorbed-form MLA decode attention (see the module docstring for shapes and numerics)."""
    _validate(q_latent, q_pe, kv_cache, block_tables, seq_lens)
    return mla_decode_paged_ref(q_latent, q_pe, kv_cache, block_tables, seq_lens, scale)
