"""Kimi-K3's block attention residuals ("AttnRes", config field `attn_res_block_size` = B).

Our reading of upstream-facts D.6 and the Block AttnRes of Kimi's "Attention Residuals" paper; no
upstream implementation was available to compare with, and no real checkpoint has been run.

Instead of one running residual, a forward keeps the completed *block representations* and the
running partial sum (the *prefix*) of the current block, all `[T, hidden]`:

- start: no completed blocks, prefix = the token embeddings;
- decoder layer `i` with `i % B == 0`: the prefix becomes completed block `i // B` and a new,
  empty prefix starts;
- each sublayer (attention, then the MLP / MoE) reads a per-token softmax mixture of the sources,
  the completed blocks plus the prefix when it is not empty, normalises it with its usual input
  norm, and adds its output to the prefix;
- after the last layer a model-level mixture of the same kind feeds the final norm.

Mixture with an RMSNorm weight `w`, eps `eps` and a pseudo-query `q` (the `[1, hidden]` weight
of a `ReplicatedLinear(hidden, 1)`), per token:
`logit_s = <rmsnorm_w(source_s), q>`, `alpha = softmax_s(logit)`, `h = sum_s alpha_s * source_s`.
The sources enter the sum unnormalised. Computed in fp32 and returned in the sources' dtype;
`<x * r * w, q> = r * <x, w * q>` with `r = rsqrt(mean(x^2) + eps)`, so the normalised sources are
never materialised.

The residual stream is replicated across TP ranks (every sharded layer all-reduces its output),
so each rank computes the same mixture with its full copy of the AttnRes weights.
"""

import torch

from vllm.model_executor.layers.layernorm import RMSNorm
from vllm.model_executor.layers.linear import ReplicatedLinear


def attn_res_mix(
    sources: torch.Tensor, norm_weight: torch.Tensor, proj_weight: torch.Tensor, eps: float
) -> torch.Tensor:
    """Softmax mixture over `sources` `[S, T, hidden]` (S >= 1) -> `[T, hidden]` in their dtype.

    `norm_weight` `[hidden]` is the RMSNorm weight applied to each source for the logits only,
    `proj_weight` `[1, hidden]` the pseudo-query, `eps` the RMSNorm epsilon.
    """
    if sources.dim() != 3 or sources.shape[0] == 0:
        raise ValueError(f"sources: expected [S >= 1, T, hidden], got {tuple(sources.shape)}")
    hidden = sources.shape[-1]
    if norm_weight.shape != (hidden,):
        raise ValueError(f"norm_weight: expected ({hidden},), got {tuple(norm_weight.shape)}")
    if proj_weight.shape != (1, hidden):
        raise ValueError(f"proj_weight: expected (1, {hidden}), got {tuple(proj_weight.shape)}")
    if not eps > 0:
        raise ValueError(f"eps: must be positive, got {eps}")
    x = sources.float()
    mean_square = torch.linalg.vector_norm(x, dim=-1).square() / hidden
    query = norm_weight.float() * proj_weight[0].float()
    logits = (x @ query) * torch.rsqrt(mean_square + eps)  # [S, T]
    alpha = logits.softmax(dim=0)
    return torch.einsum("st,sth->th", alpha, x).to(sources.dtype)


class AttnResState:
    """The residual stream of one forward under AttnRes.

    Blocks and prefix live in one buffer `[num_blocks + 1, T, hidden]` with the prefix in the
    slot after the last completed block, so the sources of a mixture are one contiguous view
    and the prefix is updated in place; block `k` sits in slot `k`, as upstream's
    `block_residual` buffer indexes it.
    """

    def __init__(self, embeddings: torch.Tensor, num_layers: int, block_size: int) -> None:
        if embeddings.dim() != 2:
            raise ValueError(f"embeddings: expected [T, hidden], got {tuple(embeddings.shape)}")
        if num_layers <= 0:
            raise ValueError(f"num_layers: must be positive, got {num_layers}")
        if block_size <= 0:
            raise ValueError(f"block_size: must be positive, got {block_size}")
        self.block_size = block_size
        num_blocks = -(-num_layers // block_size)  # layers 0, B, 2B, ... each close one block
        self.buffer = embeddings.new_empty(num_blocks + 1, *embeddings.shape)
        self.buffer[0] = embeddings
        self.prefix_slot = 0
        self.prefix_empty = False

    def begin_layer(self, layer_idx: int) -> None:
        """Called before decoder layer `layer_idx`; layers must come in order."""
        if layer_idx % self.block_size:
            return
        if layer_idx // self.block_size != self.prefix_slot:
            raise ValueError(
                f"layer_idx: layer {layer_idx} closes block {layer_idx // self.block_size}, "
                f"but block {self.prefix_slot} is the open one (layers out of order?)"
            )
        self.prefix_slot += 1
        self.prefix_empty = True

    def sources(self) -> torch.Tensor:
        """`[S, T, hidden]`: the completed blocks, then the prefix unless it is empty."""
        return self.buffer[: self.prefix_slot + (not self.prefix_empty)]

    def mix(self, norm: RMSNorm, proj: ReplicatedLinear) -> torch.Tensor:
        """The mixture of the current sources with this norm and pseudo-query."""
        return attn_res_mix(self.sources(), norm.weight, proj.weight, norm.eps)

    def add(self, delta: torch.Tensor) -> None:
        """Add a sublayer's output `[T, hidden]` to the prefix."""
        prefix = self.buffer[self.prefix_slot]
        if delta.shape != prefix.shape:
            raise ValueError(f"delta: expected {tuple(prefix.shape)}, got {tuple(delta.shape)}")
        if self.prefix_empty:
            prefix.copy_(delta)  # the empty prefix is zero; copying skips clearing the slot
        else:
            prefix.add_(delta)
        self.prefix_empty = False
