"""Token embeddings and LM head sharded over the vocabulary across TP ranks.

The vocabulary is padded to a multiple of the TP size; rank r holds rows
`[r * V_local, (r + 1) * V_local)`. The embedding looks up the ids it owns (zeros elsewhere) and
all-reduces; the LM head computes its slice of the logits and all-gathers them, dropping padding.
"""

import torch
import torch.nn.functional as F

from vllm.distributed import (
    get_tensor_model_parallel_rank,
    get_tensor_model_parallel_world_size,
    tensor_model_parallel_all_gather,
    tensor_model_parallel_all_reduce,
)


class VocabParallelEmbedding(torch.nn.Module):
    def __init__(
        self,
        num_embeddings: int,
        embedding_dim: int,
        params_dtype: torch.dtype | None = None,
        prefix: str = "",
    ) -> None:
        super().__init__()
        self.prefix = prefix
        self.tp_size = get_tensor_model_parallel_world_size()
        self.tp_rank = get_tensor_model_parallel_rank()
        self.num_embeddings = num_embeddings
        self.local = -(-num_embeddings // self.tp_size)
        self.start = self.tp_rank * self.local
        self.weight = torch.nn.Parameter(
            torch.empty(self.local, embedding_dim, dtype=params_dtype), requires_grad=False
        )

    def weight_loader(self, param: torch.nn.Parameter, loaded: torch.Tensor) -> None:
        """Load the full `[vocab, dim]` tensor: keep this rank's rows, zero the padding."""
        if loaded.shape != (self.num_embeddings, param.shape[1]):
            raise ValueError(
                f"{self.prefix}.weight: checkpoint shape {tuple(loaded.shape)}, expected "
                f"{(self.num_embeddings, param.shape[1])}"
            )
        rows = loaded[self.start : self.start + self.local]
        param.data.zero_()
        param.data[: rows.shape[0]].copy_(rows)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        if self.tp_size == 1:
            return F.embedding(ids, self.weight)
        local = ids - self.start
        owned = (local >= 0) & (local < self.local)
        out = F.embedding(torch.where(owned, local, 0), self.weight)
        out = out * owned.unsqueeze(-1).to(out.dtype)
        return tensor_model_parallel_all_reduce(out)


class ParallelLMHead(VocabParallelEmbedding):
    """The output projection to the vocabulary (its weight may be the embedding's, if tied)."""

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Logits `[T, vocab]` in the weight's dtype (tied embeddings share this layer's weight at
        load). The sampler widens them to fp32 where it computes with them, and only there: a
        greedy decode step's argmax reads them as they are (vllm/v1/sample/sampler.py)."""
        weight = self.weight
        local = F.linear(hidden.to(weight.dtype), weight)
        return tensor_model_parallel_all_gather(local, dim=-1)[:, : self.num_embeddings]
