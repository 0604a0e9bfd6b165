"""Expert selection: DeepSeek-V3-style `noaux_tc` grouped top-k (Kimi's router).

Scores are `sigmoid` (or `softmax`) of the fp32 router logits. Selection uses the scores plus the
`e_score_correction_bias`: groups are ranked by the sum of their two best biased scores, the best
`topk_group` groups kept, then the `top_k` best biased experts among them. The weights are the
unbiased scores of the chosen experts, renormalised to sum to one if asked, times
`routed_scaling_factor`.

Only fixed-shape ops (topk, gather, scatter, masked_fill), so routing never syncs the host and can
be captured in a CUDA graph; the argument checks read shapes, never values.
"""

import torch


def grouped_topk(
    router_logits: torch.Tensor,
    e_score_correction_bias: torch.Tensor | None,
    top_k: int,
    num_expert_group: int = 1,
    topk_group: int = 1,
    renormalize: bool = True,
    routed_scaling_factor: float = 1.0,
    scoring_func: str = "sigmoid",
) -> tuple[torch.Tensor, torch.Tensor]:
    """`router_logits` `[T, E]` -> (weights `[T, top_k]` fp32, expert ids `[T, top_k]` int64)."""
    logits = router_logits.float()
    if scoring_func == "sigmoid":
        scores = logits.sigmoid()
    elif scoring_func == "softmax":
        scores = logits.softmax(dim=-1)
    else:
        raise ValueError(f"scoring_func {scoring_func!r} is not 'sigmoid' or 'softmax'")
    tokens, experts = scores.shape
    if not 0 < top_k <= experts:
        raise ValueError(f"top_k {top_k} is not in [1, num_experts={experts}]")
    if num_expert_group > 1:
        if experts % num_expert_group or experts // num_expert_group < 2:
            raise ValueError(
                f"num_expert_group {num_expert_group} must split {experts} experts into groups "
                "of at least 2"
            )
        if not 0 < topk_group <= num_expert_group:
            raise ValueError(f"topk_group {topk_group} is not in [1, {num_expert_group}]")
    choice = scores if e_score_correction_bias is None else scores + e_score_correction_bias
    if num_expert_group > 1:
        grouped = choice.view(tokens, num_expert_group, experts // num_expert_group)
        group_scores = grouped.topk(2, dim=-1)[0].sum(dim=-1)
        keep = torch.zeros_like(group_scores, dtype=torch.bool)
        keep.scatter_(1, group_scores.topk(topk_group, dim=-1)[1], True)
        choice = grouped.masked_fill(~keep.unsqueeze(-1), float("-inf")).view(tokens, experts)
    ids = choice.topk(top_k, dim=-1)[1]
    weights = scores.gather(1, ids)
    if renormalize:
        weights = weights / (weights.sum(dim=-1, keepdim=True) + 1e-20)
    return weights * routed_scaling_factor, ids
