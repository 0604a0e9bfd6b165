"""`FusedMoE`: the routed experts of a MoE layer, tensor parallel over the intermediate dim.

Weights: `w13_weight` `[E, 2 * I_local, H]` (gate | up of each expert) and `w2_weight`
`[E, H, I_local]`, loaded from the checkpoint's per-expert `w1` (gate), `w3` (up) and `w2` (down).
The forward takes the router's `(weights, ids)` and returns the weighted sum of the chosen experts'
outputs, all-reduced over TP ranks when `reduce_results`. The expert computation is one of the
implementations in `experts.py`, chosen from the device, dtype, batch shape and activation (static
facts), so a decode batch runs without host syncs and can be captured in a CUDA graph.

With `num_fused_shared_experts` S > 0 the layer also holds S shared experts of the routed size as
experts `E ... E + S - 1` (weights `[E + S, ...]`), loaded through `weight_loader` under those ids
and sharded like the routed ones; the router appends their ids with weight 1.0
(`RoutingParams(..., num_fused_shared_experts=S)`), so the forward's last S columns are them.
"""

import torch

from vllm.distributed import (
    get_tensor_model_parallel_rank,
    get_tensor_model_parallel_world_size,
    tensor_model_parallel_all_reduce,
)
from vllm.model_executor.layers.fused_moe.experts import select_experts_impl


class FusedMoE(torch.nn.Module):
    def __init__(
        self,
        num_experts: int,
        hidden_size: int,
        intermediate_size: int,
        act_and_mul: torch.nn.Module,
        params_dtype: torch.dtype | None = None,
        reduce_results: bool = True,
        prefix: str = "",
        num_fused_shared_experts: int = 0,
    ) -> None:
        super().__init__()
        self.tp_size = get_tensor_model_parallel_world_size()
        self.tp_rank = get_tensor_model_parallel_rank()
        if intermediate_size % self.tp_size:
            raise ValueError(f"{prefix}: moe intermediate {intermediate_size} % TP {self.tp_size}")
        if num_fused_shared_experts < 0:
            raise ValueError(f"{prefix}: num_fused_shared_experts {num_fused_shared_experts} < 0")
        self.num_experts = num_experts  # routed experts only
        self.num_fused_shared_experts = num_fused_shared_experts
        slots = num_experts + num_fused_shared_experts
        self.local_intermediate = intermediate_size // self.tp_size
        self.act_and_mul = act_and_mul
        self.reduce_results = reduce_results
        self.prefix = prefix
        dtype = params_dtype or torch.get_default_dtype()
        i = self.local_intermediate
        self.w13_weight = torch.nn.Parameter(
            torch.empty(slots, 2 * i, hidden_size, dtype=dtype), requires_grad=False
        )
        self.w2_weight = torch.nn.Parameter(
            torch.empty(slots, hidden_size, i, dtype=dtype), requires_grad=False
        )

    def weight_loader(self, loaded: torch.Tensor, expert_id: int, shard: str) -> None:
        """Load one expert's `w1` (gate `[I, H]`), `w3` (up `[I, H]`) or `w2` (down `[H, I]`);
        ids from `num_experts` on are the fused shared experts."""
        if not 0 <= expert_id < self.w13_weight.shape[0]:
            raise ValueError(f"{self.prefix}: expert {expert_id} out of range")
        i = self.local_intermediate
        start = self.tp_rank * i
        full = (i * self.tp_size, self.w13_weight.shape[2])  # [I, H] for w1 / w3
        expected = full if shard in ("w1", "w3") else full[::-1]
        if shard in ("w1", "w2", "w3") and tuple(loaded.shape) != expected:
            raise ValueError(
                f"{self.prefix}.experts.{expert_id}.{shard}: checkpoint shape "
                f"{tuple(loaded.shape)}, expected {expected}"
            )
        if shard in ("w1", "w3"):
            part = loaded.narrow(0, start, i)
            target = self.w13_weight.data[expert_id, (0 if shard == "w1" else i) :][:i]
        elif shard == "w2":
            part = loaded.narrow(1, start, i)
            target = self.w2_weight.data[expert_id]
        else:
            raise ValueError(f"{self.prefix}: unknown expert weight {shard!r}")
        target.copy_(part)

    def forward(
        self, x: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor
    ) -> torch.Tensor:
        out = self._experts(x, topk_weights, topk_ids)
        if self.reduce_results and self.tp_size > 1:
            out = tensor_model_parallel_all_reduce(out)
        return out

    def _experts(
        self, x: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor
    ) -> torch.Tensor:
        rows, inter = topk_ids.numel(), self.local_intermediate
        impl = select_experts_impl(x.device, x.dtype, rows, x.shape[1], inter, self.act_and_mul)
        return impl(x, self.w13_weight, self.w2_weight, topk_weights, topk_ids, self.act_and_mul)
