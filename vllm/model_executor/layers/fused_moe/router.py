"""Expert selection: DeepSeek-V3-style `noaux_tc` grouped top-k (Kimi's router).

Scores are `sigmoid` (or `softmax`) of the router logits, in fp32. Selection uses the scores plus
the `e_score_correction_bias`: with `num_expert_group > 1`, groups are ranked by the sum of their
two best biased scores and the best `topk_group` groups kept; then the `top_k` best biased experts
among the kept ones are chosen, best first. The weights are the unbiased scores of the chosen
experts, renormalised to sum to one if asked (`w / (sum(w) + 1e-20)`), times
`routed_scaling_factor`.

`grouped_topk(router_logits, e_score_correction_bias, routing)`:
  router_logits            `[T, E]` bf16 / fp16 / fp32, any strides (read as fp32)
  e_score_correction_bias  `[E]` floating point (read as fp32), any stride, or None
  routing                  `RoutingParams`: E, top_k, the grouping, scoring, renormalisation,
                           scaling and S below; checked once, when built
  returns                  weights `[T, top_k + S]` fp32, expert ids `[T, top_k + S]` int64

`num_fused_shared_experts` S (default 0) appends S columns after the routed ones: ids `E, ...,
E + S - 1` with weight exactly 1.0 (neither renormalised nor scaled). A MoE layer whose experts
kernels hold the shared experts as experts `E...` then sums them with the routed outputs in one
weighted sum (`KimiMoE`), and the kernel writes those columns itself: no concatenation launch.

`grouped_topk` runs `grouped_topk_triton` where `use_triton(device)` says so, else the torch
reference `grouped_topk_ref`. Both use fixed shapes only and check the tensors from metadata, never
values, so routing never syncs the host and can be captured in a CUDA graph.

Kernel: one program per token (a decode batch is a few hundred tokens at most, and a program is a
handful of register-resident reductions, so more tokens per program would only serialise them).
The token's E logits sit in one `next_pow2(E)` register vector; the group ranking uses a
`[next_pow2(groups), next_pow2(E)]` membership tile, so group sizes need not be powers of two.
The `top_k` experts come from one `tl.topk` of a distinct int64 key per lane: the biased score
mapped to int32 in order in the high half, `BLOCK_E - lane` in the low half (so equal scores rank
the lowest expert first), padded lanes the smallest key. It returns the largest
`next_pow2(top_k + S)` keys in descending order (lanes are padded to at least that many), and one
masked reduction gathers the chosen experts' unbiased scores. `tl.topk` is Triton's bitonic top-k:
it sorts runs of that many keys, then halves the candidates by a pairwise max and merges the
survivors, again until one run is left. With distinct keys it gives the same keys in the same
order as a full sort of the `BLOCK_E` keys (the form before) in fewer compare-and-swap stages
(26 against 36 at 256 keys and k = 16), and only its halving steps compare keys farther apart
than a run, where most of the full sort's later stages crossed warps; `top_k` dependent rounds of
argmax would take three reductions each. Its chain of stages sets the latency of the standalone
kernel and, per token, of fused_router.py's serial selection: in the sm_90 PTX (Triton 3.6) at
Kimi-Linear's 256 experts, top-8 + 1 shared, the fused norm + router kernel has 25 barriers where
the full sort had 37, the standalone kernel 12 where it had 24; on the H200 the fused norm +
router took 5.5 against 6.4 us at one token and the top-k kernel 2.3 / 2.3 / 2.6 against 3.1 /
3.2 / 3.9 us at 1 / 64 / 256 tokens (docs/performance.md, "Twenty-third run"). At k = 1 the
selection is a max instead (Triton 3.6's `tl.topk` fails there).
The selection of a token is the @triton.jit helper `grouped_topk_row`, which fused_router.py's
one-launch router (logits and selection, at decode sizes) runs too.

Ties: the kernel's rule is that among equal biased scores (or equal group scores) the lowest
expert (group) index wins. torch's `topk` documents no tie order, so the two agree on ids only
when the deciding values are distinct: the tests compare the two on tie-free random data, and
check tied data against a stable sort. Divisions are correctly rounded (`div_rn`, as torch's;
Triton's `/` is approximate in fp32 on NVIDIA), so the weights differ from the reference only by
`exp` (approximate on GPUs) and the order of the softmax / renormalising sums: a few fp32 ulps.
A NaN logit gives unspecified, but in-range and distinct, ids (a NaN's key sorts above +inf or
below -inf by its sign, but above padded lanes).

The logits themselves: `router_logits(x, gate_weight)` is `F.linear(x.float(), gate_weight)`
(reference `router_logits_ref`) for hidden states `x` `[T, H]` bf16 / fp16 / fp32 and the fp32
gate `[E, H]`, returning `[T, E]` fp32. On a GPU it runs the fp32-weight kernel of
vllm/model_executor/kernels/linear/gemv.py (`gemv_fp32`), which reads x as it is instead of
writing an fp32 copy and keeps fp32 accuracy (no TF32: top-k selection is sensitive to the
logits): IEEE fp32 products up to `ROUTER_GEMV_MAX_T` tokens (for bf16 x: up to 4), and for bf16
x above that its `bf16x3` form, exact products of the gate split into three bf16 terms on bf16
tensor cores. fp16 / fp32 x above `ROUTER_GEMV_MAX_T` tokens keep cuBLAS's fp32 GEMM. The choice
depends on T and the dtype only, so a captured graph always holds the path its size was captured
with.
"""

import math
from dataclasses import KW_ONLY, dataclass

import torch
import torch.nn.functional as F

from vllm.model_executor.kernels.linear.gemv import gemv_fp32
from vllm.triton_utils import next_power_of_2, use_triton
from vllm.triton_utils.launch import launch, launch_spec
from vllm.triton_utils.pdl import pdl_options, use_pdl

try:
    import triton
    import triton.language as tl

    from vllm.triton_utils.pdl import pdl_wait
except ImportError:  # CPU-only installs without Triton use the reference
    triton = None

_SCORING = ("sigmoid", "softmax")
_LOGIT_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
_EPS = 1e-20
# Tokens up to which `router_logits` takes the GEMV kernel for any x dtype (FMA products); above
# it only bf16 x, through bf16x3. On the H200 (benchmark_router.py --logits, graph replay with the
# x.float() copy counted, 2026-12-01): FMA 4.1 vs cuBLAS 6.6 us at T = 1, 11.8 vs 16.8 us at T = 8,
# but 23.9 vs 16.1 at T = 64 and 58.3 vs 21.2 at T = 256; bf16x3 (gemv_config._fp32_config, bf16
# x from T = 5) 7.4 at T = 8, 7.9 and 10.7 at T = 64 and 256.
ROUTER_GEMV_MAX_T = 8

if triton is not None:

    @triton.jit
    def grouped_topk_row(
        x, bias_ptr, stride_b, weights_row_ptr, ids_row_ptr, scale,
        E: tl.constexpr, BLOCK_E: tl.constexpr, TOP_K: tl.constexpr, BLOCK_K: tl.constexpr,
        NUM_GROUPS: tl.constexpr, GROUP_SIZE: tl.constexpr, BLOCK_G: tl.constexpr,
        TOPK_GROUP: tl.constexpr, HAS_BIAS: tl.constexpr, SOFTMAX: tl.constexpr,
        RENORMALIZE: tl.constexpr, NUM_SHARED: tl.constexpr,
    ):  # fmt: skip
        """The selection of one token from its fp32 logits `x` `[BLOCK_E]` (lanes from E on are
        ignored): stores its `TOP_K + NUM_SHARED` weights and int64 ids at the row pointers.
        Shared by `_grouped_topk_kernel` and fused_router.py's kernel."""
        offs = tl.arange(0, BLOCK_E)
        valid = offs < E
        # Padded lanes address a real expert (masked), so no out-of-bounds address is formed.
        safe = tl.minimum(offs, E - 1)
        if SOFTMAX:
            x = tl.where(valid, x, float("-inf"))
            ex = tl.exp(x - tl.max(x, axis=0))
            scores = tl.div_rn(ex, tl.broadcast_to(tl.sum(ex, axis=0), [BLOCK_E]))
        else:
            scores = tl.div_rn(tl.full([BLOCK_E], 1.0, tl.float32), 1.0 + tl.exp(-x))
        choice = scores
        if HAS_BIAS:
            bias = tl.load(bias_ptr + safe * stride_b, mask=valid, other=0.0)
            choice = choice + bias.to(tl.float32)
        choice = tl.where(valid, choice, float("-inf"))

        if NUM_GROUPS > 1:
            g = tl.arange(0, BLOCK_G)
            g_valid = g < NUM_GROUPS
            member = ((offs[None, :] // GROUP_SIZE) == g[:, None]) & valid[None, :]
            tile = tl.where(member, choice[None, :], float("-inf"))
            best = tl.max(tile, axis=1)
            first = tl.min(tl.where(member & (tile == best[:, None]), offs[None, :], BLOCK_E), 1)
            second = tl.max(tl.where(offs[None, :] == first[:, None], float("-inf"), tile), 1)
            group_score = best + second
            kept = tl.zeros([BLOCK_G], dtype=tl.int32)
            for _ in range(TOPK_GROUP):
                open_g = g_valid & (kept == 0)
                top = tl.max(tl.where(open_g, group_score, float("-inf")), axis=0)
                pick = tl.min(tl.where(open_g & (group_score == top), g, BLOCK_G), axis=0)
                # A NaN group score matches nothing: fall back to the lowest open group.
                pick = tl.where(pick < BLOCK_G, pick, tl.min(tl.where(open_g, g, BLOCK_G), 0))
                kept = tl.where(g == pick, 1, kept)
            lane_kept = tl.max(tl.where(member & (kept[:, None] != 0), 1, 0), axis=0)
            choice = tl.where(lane_kept != 0, choice, float("-inf"))

        # The top TOP_K from `tl.topk` of a distinct int64 key per lane: the high half maps
        # the fp32 choice to int32 in order (negatives get their magnitude bits flipped; choice
        # is never -0.0, as the score never is, so equal choices get equal high halves),
        # the low half is BLOCK_E - lane, so among equal choices the lowest expert ranks first.
        # Padded lanes take the bits of the lowest NaN and a zero low half: the smallest int64,
        # below every expert's key (NaN choices included), so the first TOP_K are real experts.
        tl.static_assert(BLOCK_K <= BLOCK_E)
        bits = tl.where(valid, choice.to(tl.int32, bitcast=True), -1)
        key = (bits ^ ((bits >> 31) & 0x7FFFFFFF)).to(tl.int64) << 32
        key += tl.where(valid, BLOCK_E - offs, 0)
        if BLOCK_K == 1:
            # Triton 3.6's `tl.topk` fails at k = 1 (3.9 takes a max there, as here).
            leading = tl.max(key, 0, keep_dims=True)
        else:
            leading = tl.topk(key, BLOCK_K)
        k_offs = tl.arange(0, BLOCK_K)
        ids = BLOCK_E - leading.to(tl.int32)  # the low half; slots from TOP_K on are overwritten
        hit = (offs[None, :] == ids[:, None]) & (k_offs < TOP_K)[:, None]
        weights = tl.sum(tl.where(hit, scores[None, :], 0.0), axis=1)
        if RENORMALIZE:
            total = tl.sum(weights, axis=0) + 1e-20
            weights = tl.div_rn(weights, tl.broadcast_to(total, [BLOCK_K]))
        weights = weights * scale
        if NUM_SHARED > 0:
            shared = k_offs >= TOP_K
            weights = tl.where(shared, 1.0, weights)
            ids = tl.where(shared, E + k_offs - TOP_K, ids)
        k_valid = k_offs < TOP_K + NUM_SHARED
        tl.store(weights_row_ptr + k_offs, weights, mask=k_valid)
        tl.store(ids_row_ptr + k_offs, ids.to(tl.int64), mask=k_valid)

    @triton.jit
    def _grouped_topk_kernel(
        logits_ptr, bias_ptr, weights_ptr, ids_ptr,
        stride_lt, stride_le, stride_b, stride_wt, stride_it, scale,
        E: tl.constexpr, BLOCK_E: tl.constexpr, TOP_K: tl.constexpr, BLOCK_K: tl.constexpr,
        NUM_GROUPS: tl.constexpr, GROUP_SIZE: tl.constexpr, BLOCK_G: tl.constexpr,
        TOPK_GROUP: tl.constexpr, HAS_BIAS: tl.constexpr, SOFTMAX: tl.constexpr,
        RENORMALIZE: tl.constexpr, NUM_SHARED: tl.constexpr,
        PDL: tl.constexpr = False,
    ):  # fmt: skip
        pdl_wait(PDL)
        t = tl.program_id(0).to(tl.int64)
        offs = tl.arange(0, BLOCK_E)
        safe = tl.minimum(offs, E - 1)
        x = tl.load(logits_ptr + t * stride_lt + safe * stride_le, mask=offs < E, other=0.0)
        grouped_topk_row(
            x.to(tl.float32), bias_ptr, stride_b, weights_ptr + t * stride_wt,
            ids_ptr + t * stride_it, scale,
            E, BLOCK_E, TOP_K, BLOCK_K, NUM_GROUPS, GROUP_SIZE, BLOCK_G, TOPK_GROUP, HAS_BIAS,
            SOFTMAX, RENORMALIZE, NUM_SHARED,
        )  # fmt: skip


_INT_FIELDS = ("num_experts", "top_k", "num_expert_group", "topk_group", "num_fused_shared_experts")


@dataclass(frozen=True)
class RoutingParams:
    """What a MoE layer's selection is, checked once when built (ValueError naming the field):
    `top_k` of `num_experts` routed experts per token, from the best `topk_group` of
    `num_expert_group` groups (1: no grouping; `topk_group` is then unused), scored by
    `scoring_func`, renormalised if `renormalize`, times `routed_scaling_factor`, then
    `num_fused_shared_experts` shared columns (module docstring).

    The tensors stay arguments of each call: the logits (or hidden states and gate) and the
    `e_score_correction_bias`, a learned per-layer tensor like the gate. A module that kept its
    bias in here would route with a stale tensor once `load_state_dict(assign=True)` (or `.to()`
    under torch's overwrite-on-conversion setting) replaced the Parameter; as plain values the
    params compare, hash and print as configuration. Each call checks its tensors against them
    (`check_inputs`), from metadata only."""

    num_experts: int
    top_k: int
    _: KW_ONLY
    num_expert_group: int = 1
    topk_group: int = 1
    renormalize: bool = True
    routed_scaling_factor: float = 1.0
    scoring_func: str = "sigmoid"
    num_fused_shared_experts: int = 0

    def __post_init__(self) -> None:
        for name in _INT_FIELDS:
            value = getattr(self, name)
            # bool is an int in Python, but never a count.
            if type(value) is not int:
                raise TypeError(f"{name} must be an int, got {value!r}")
        if not math.isfinite(self.routed_scaling_factor):
            raise ValueError(
                f"routed_scaling_factor must be finite, got {self.routed_scaling_factor}"
            )
        experts, top_k, groups = self.num_experts, self.top_k, self.num_expert_group
        if self.num_fused_shared_experts < 0:
            raise ValueError(
                f"num_fused_shared_experts must be >= 0, got {self.num_fused_shared_experts}"
            )
        if self.scoring_func not in _SCORING:
            raise ValueError(f"scoring_func {self.scoring_func!r} is not 'sigmoid' or 'softmax'")
        if not 0 < top_k <= experts:
            raise ValueError(f"top_k {top_k} is not in [1, num_experts={experts}]")
        if groups < 1:
            raise ValueError(f"num_expert_group must be >= 1, got {groups}")
        if groups > 1:
            if experts % groups or experts // groups < 2:
                raise ValueError(
                    f"num_expert_group {groups} must split {experts} experts into groups of at "
                    "least 2"
                )
            if not 0 < self.topk_group <= groups:
                raise ValueError(f"topk_group {self.topk_group} is not in [1, {groups}]")
            kept = self.topk_group * (experts // groups)
            if top_k > kept:
                # Else the reference would fill the rest with arbitrary experts of dropped groups.
                raise ValueError(
                    f"top_k {top_k} exceeds the {kept} experts of the {self.topk_group} kept groups"
                )

    @property
    def columns(self) -> int:
        """Output columns per token: the routed experts, then the fused shared ones."""
        return self.top_k + self.num_fused_shared_experts

    def check_inputs(
        self,
        experts: int,
        device: torch.device,
        e_score_correction_bias: torch.Tensor | None,
        source: str,
    ) -> None:
        """ValueError unless `source` (the logits, or the gate) with `experts` experts on `device`
        and the bias fit these params (metadata only; also fused_router.py's check)."""
        if experts != self.num_experts:
            raise ValueError(
                f"{source} has {experts} experts, routing.num_experts is {self.num_experts}"
            )
        bias = e_score_correction_bias
        if bias is None:
            return
        if tuple(bias.shape) != (experts,):
            raise ValueError(
                f"e_score_correction_bias must be [E={experts}], got {tuple(bias.shape)}"
            )
        if not bias.is_floating_point():
            raise ValueError(f"e_score_correction_bias must be floating point, got {bias.dtype}")
        if bias.device != device:
            raise ValueError(
                f"e_score_correction_bias is on {bias.device}, the {source} on {device}"
            )


def _check_args(
    router_logits: torch.Tensor,
    e_score_correction_bias: torch.Tensor | None,
    routing: RoutingParams,
) -> None:
    """Metadata checks shared by the kernel and the reference (never reads tensor values)."""
    if router_logits.dim() != 2:
        raise ValueError(f"router_logits must be [T, E], got shape {tuple(router_logits.shape)}")
    if router_logits.dtype not in _LOGIT_DTYPES:
        raise ValueError(f"router_logits dtype {router_logits.dtype} is not one of {_LOGIT_DTYPES}")
    routing.check_inputs(
        router_logits.shape[1], router_logits.device, e_score_correction_bias, "router_logits"
    )


def grouped_topk_ref(
    router_logits: torch.Tensor,
    e_score_correction_bias: torch.Tensor | None,
    routing: RoutingParams,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The torch reference; see the module docstring for shapes and semantics."""
    _check_args(router_logits, e_score_correction_bias, routing)
    logits = router_logits.float()
    scores = logits.sigmoid() if routing.scoring_func == "sigmoid" else logits.softmax(dim=-1)
    tokens, experts = scores.shape
    groups, shared = routing.num_expert_group, routing.num_fused_shared_experts
    choice = scores if e_score_correction_bias is None else scores + e_score_correction_bias
    if groups > 1:
        grouped = choice.view(tokens, groups, experts // groups)
        group_scores = grouped.topk(2, dim=-1)[0].sum(dim=-1)
        keep = torch.zeros_like(group_scores, dtype=torch.bool)
        keep.scatter_(1, group_scores.topk(routing.topk_group, dim=-1)[1], True)
        choice = grouped.masked_fill(~keep.unsqueeze(-1), float("-inf")).view(tokens, experts)
    ids = choice.topk(routing.top_k, dim=-1)[1]
    weights = scores.gather(1, ids)
    if routing.renormalize:
        weights = weights / (weights.sum(dim=-1, keepdim=True) + _EPS)
    weights = weights * routing.routed_scaling_factor
    if shared:
        shared_ids = torch.arange(experts, experts + shared, device=ids.device)
        ids = torch.cat([ids, shared_ids.expand(tokens, -1)], dim=1)
        weights = torch.cat([weights, weights.new_ones(tokens, shared)], dim=1)
    return weights, ids


# Tokens above which the top-k kernel's programs keep one warp.
_WIDE_MAX_TOKENS = 256


def _default_warps(block_e: int, tokens: int) -> int:
    # The selection's stages are independent across lanes (measured with the full sort that
    # `tl.topk` replaced): at 256 experts 4 warps beat 1 at every
    # batch timed on the H200 (benchmark_router.py --warps 1 2 4, 2026-12-01: 3.6 / 3.7 / 4.4 us
    # against 4.2 / 4.5 / 4.6 at T = 1 / 64 / 256), although the stages that cross warps go
    # through shared memory. A prefill's thousands of programs fill the GPU with one warp each:
    # 4.7 / 8.9 / 27.8 us against 6.3 / 17.4 / 60.8 with 4 warps at T = 512 / 2048 / 8192
    # (benchmark_router.py --warps, 2026-12-02, docs/performance.md "Ninth run"). The
    # renormalizing sum's order follows the warps, so a token's weights may differ in their last
    # bits between batches of <= 256 and > 256 tokens (the ids do not). Tiny expert counts keep
    # one warp: there is nothing to spread.
    return 1 if block_e < 128 or tokens > _WIDE_MAX_TOKENS else 4


def grouped_topk_triton(
    router_logits: torch.Tensor,
    e_score_correction_bias: torch.Tensor | None,
    routing: RoutingParams,
    *,
    num_warps: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The Triton kernel (one launch, or none for zero tokens); `num_warps` overrides the
    default per-program warps (a power of two)."""
    _check_args(router_logits, e_score_correction_bias, routing)
    if not use_triton(router_logits.device):
        raise ValueError(
            f"grouped_topk_triton needs a CUDA / ROCm device or TRITON_INTERPRET=1 on CPU, got "
            f"{router_logits.device}"
        )
    tokens, experts = router_logits.shape
    columns = routing.columns
    # Lanes for every output slot too: the selection reads its slots off the top-k's lanes.
    block_e = next_power_of_2(max(experts, columns))
    if num_warps is None:
        num_warps = _default_warps(block_e, tokens)
    elif num_warps < 1 or num_warps & (num_warps - 1):
        raise ValueError(f"num_warps must be a positive power of two, got {num_warps}")
    device = router_logits.device
    weights = torch.empty(tokens, columns, dtype=torch.float32, device=device)
    ids = torch.empty(tokens, columns, dtype=torch.int64, device=device)
    if tokens == 0:
        return weights, ids
    groups = routing.num_expert_group
    bias = e_score_correction_bias
    launch(
        _grouped_topk_kernel, (tokens, 1, 1),
        (
            router_logits, bias if bias is not None else router_logits, weights, ids,
            router_logits.stride(0), router_logits.stride(1),
            bias.stride(0) if bias is not None else 0, weights.stride(0), ids.stride(0),
            float(routing.routed_scaling_factor),
        ),
        launch_spec(
            _grouped_topk_kernel, E=experts, BLOCK_E=block_e, TOP_K=routing.top_k,
            BLOCK_K=next_power_of_2(columns), NUM_GROUPS=groups, GROUP_SIZE=experts // groups,
            BLOCK_G=next_power_of_2(groups), TOPK_GROUP=routing.topk_group if groups > 1 else 1,
            HAS_BIAS=bias is not None, SOFTMAX=routing.scoring_func == "softmax",
            RENORMALIZE=bool(routing.renormalize), NUM_SHARED=routing.num_fused_shared_experts,
            num_warps=num_warps, **pdl_options(use_pdl(device)),
        ),
    )  # fmt: skip
    return weights, ids


def grouped_topk(
    router_logits: torch.Tensor,
    e_score_correction_bias: torch.Tensor | None,
    routing: RoutingParams,
) -> tuple[torch.Tensor, torch.Tensor]:
    """`router_logits` `[T, E]` -> (weights `[T, top_k + S]` fp32, expert ids `[T, top_k + S]`
    int64, S = `routing.num_fused_shared_experts`): the Triton kernel where `use_triton` says
    so, else the torch reference."""
    impl = grouped_topk_triton if use_triton(router_logits.device) else grouped_topk_ref
    return impl(router_logits, e_score_correction_bias, routing)


def check_logits_args(x: torch.Tensor, gate_weight: torch.Tensor) -> None:
    """ValueError unless `x` `[T, H]` (bf16 / fp16 / fp32) and the fp32 gate `[E, H]` fit
    `router_logits` (also fused_router.py's check)."""
    if x.dim() != 2 or gate_weight.dim() != 2 or x.shape[1] != gate_weight.shape[1]:
        raise ValueError(
            f"x must be [T, H] and gate_weight [E, H], got {tuple(x.shape)} and "
            f"{tuple(gate_weight.shape)}"
        )
    if x.dtype not in _LOGIT_DTYPES:
        raise ValueError(f"x dtype {x.dtype} is not one of {_LOGIT_DTYPES}")
    if gate_weight.dtype != torch.float32:
        raise ValueError(f"gate_weight must be float32, got {gate_weight.dtype}")
    if x.device != gate_weight.device:
        raise ValueError(f"x is on {x.device}, gate_weight on {gate_weight.device}")


def router_logits_ref(x: torch.Tensor, gate_weight: torch.Tensor) -> torch.Tensor:
    """The torch reference: `F.linear(x.float(), gate_weight)`, `[T, E]` fp32."""
    check_logits_args(x, gate_weight)
    return F.linear(x.float(), gate_weight)


def router_logits(x: torch.Tensor, gate_weight: torch.Tensor) -> torch.Tensor:
    """Router logits `[T, E]` fp32 of hidden states `x` `[T, H]` (bf16 / fp16 / fp32) and the fp32
    gate `gate_weight` `[E, H]`: the GEMV kernel for 1..`ROUTER_GEMV_MAX_T` tokens, and for any
    number of bf16 tokens, where `use_triton` says so and both have unit stride on H; else the
    reference."""
    check_logits_args(x, gate_weight)
    t = x.shape[0]
    if (
        use_triton(x.device)
        and 0 < t
        and (t <= ROUTER_GEMV_MAX_T or x.dtype == torch.bfloat16)
        and x.stride(1) == 1
        and gate_weight.stride(1) == 1
    ):
        return gemv_fp32(x, gate_weight)
    return F.linear(x.float(), gate_weight)
