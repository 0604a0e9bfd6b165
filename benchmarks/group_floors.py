"""The floors of the profiler's kernel groups (step_profile.py's `CATEGORIES`) for a loaded Kimi
model: the bytes each group of a decode step must move, and the FLOPs and bytes each group of a
prefill must compute and move, as `step_profile.breakdown` takes them (issue 12's table: kernel
group, us per step, % of its own floor).

Two properties of the loaded model change which group pays for what: shared experts fused into
the routed experts' kernels (`VLLM_KIMI_FUSE_SHARED_EXPERTS`) are read by those kernels, not by a
dense GEMM, and FP8 weights (the PTPC recipe's `o_proj`) are one byte each and run at twice the
bf16 rate.
"""

import torch
from bench_utils import expected_distinct_experts

from vllm.model_executor.layers.fused_moe.layer import FusedMoE
from vllm.models.kimi_k3.amd.footprint import ModelFootprint

# Both FP8 flavours the PTPC weights take (`Platform.fp8_dtype`): one byte a weight.
FP8_DTYPES = (torch.float8_e4m3fn, torch.float8_e4m3fnuz)


def fused_shared_experts(model: torch.nn.Module) -> tuple[int, int]:
    """(parameters, bytes) of the shared experts that `model` runs as one more expert of the
    routed experts' kernels (`VLLM_KIMI_FUSE_SHARED_EXPERTS`, the default where they fit): the
    routed experts' group computes and reads them, not a dense GEMM."""
    shared = [
        w[m.num_experts :]
        for m in model.modules()
        if isinstance(m, FusedMoE)
        for w in (m.w13_weight, m.w2_weight)
    ]
    return sum(w.numel() for w in shared), sum(w.numel() * w.element_size() for w in shared)


def fp8_weights(model: torch.nn.Module) -> tuple[int, int, bool]:
    """(FP8 weights, those outside the routed experts, whether the experts are FP8) of `model`,
    one byte each: the profiles' FP8 floors. Either FP8 flavour counts: the PTPC weights are
    e4m3fnuz on gfx94x (MI300, MI325), e4m3fn elsewhere (`Platform.fp8_dtype`)."""
    moe = [m for m in model.modules() if isinstance(m, FusedMoE)]
    expert_ids = {id(p) for m in moe for p in m.parameters()}
    fp8 = [p for p in model.parameters() if p.dtype in FP8_DTYPES]
    dense = sum(p.numel() for p in fp8 if id(p) not in expert_ids)
    return sum(p.numel() for p in fp8), dense, any(m.w13_weight.dtype in FP8_DTYPES for m in moe)


def decode_group_floors(
    fp: ModelFootprint, distinct: list[float], contexts: list[int], fp8_weight_bytes: int,
    fused_shared_bytes: int,
) -> dict[str, float]:  # fmt: skip
    """Bytes a decode step's kernel groups must move (step_profile.py's groups): `distinct`
    experts per MoE layer, `contexts` per sequence (tokens in its cache after the step),
    `fused_shared_bytes` of shared experts read by the routed experts' kernels (in
    `fp.dense_decode_bytes`, as every step reads them)."""
    batch = len(contexts)
    return {
        "routed experts": sum(distinct) * fp.expert_bytes + fused_shared_bytes,
        "KDA decode": 2 * batch * fp.kda_state_bytes_per_seq,
        "MLA decode": (sum(contexts) + batch) * fp.mla_bytes_per_token,
        "FP8 GEMM": fp8_weight_bytes,
        # Every other weight a decode step reads; norms and convolution taps included
        # (a few MB of 3 GB), and the fp32 routers (61 MB on Kimi-Linear-48B) that the fused
        # router, in "other", reads.
        "bf16 GEMM / GEMV": fp.dense_decode_bytes - fp8_weight_bytes - fused_shared_bytes,
    }


def prefill_group_floors(
    fp: ModelFootprint, length: int, chunks: list[int], fp8_dense_params: int,
    fp8_experts: bool, attention_flops: float, fused_shared_params: int,
    fused_shared_bytes: int,
) -> tuple[dict[str, float], dict[str, float]]:  # fmt: skip
    """(FLOPs, bytes) a prefill of one prompt of `length` tokens in `chunks` must compute and
    move per kernel group: `fp8_dense_params` FP8 weights outside the routed experts (one byte
    each), `fp8_experts` whether the experts are FP8, `fused_shared_params` / `_bytes` of shared
    experts that the routed experts' kernels run (bf16: FP8 experts do not fuse them)."""
    routed_active = fp.num_moe_layers * fp.top_k * fp.params_per_expert
    bf16_dense = (
        fp.active_params_without_lm_head - routed_active - fp8_dense_params - fused_shared_params
    )
    num_experts = fp.routed_expert_params // max(1, fp.params_per_expert * fp.num_moe_layers)
    experts_read = (
        sum(expected_distinct_experts(num_experts, fp.top_k, n) for n in chunks) * fp.num_moe_layers
    )
    # FP8 GEMMs run at twice the bf16 rate on the H200: their FLOPs count half at its peak.
    fp8_scale = 0.5
    expert_flops = 2.0 * length * routed_active * (fp8_scale if fp8_experts else 1.0)
    expert_flops += 2.0 * length * fused_shared_params
    floor_flops = {
        "MLA prefill attention": attention_flops,
        "routed experts": expert_flops,
        "FP8 GEMM": fp8_scale * 2.0 * length * fp8_dense_params,
        "bf16 GEMM / GEMV": 2.0 * (length * bf16_dense + fp.lm_head_params),
    }
    # The LM head runs on the rows that sample: the last chunk's, one row; the other chunks'
    # steps multiply no row by it and do not read it.
    per_chunk = fp.dense_decode_bytes - fp8_dense_params - fused_shared_bytes - fp.lm_head_bytes
    floor_bytes = {
        "routed experts": experts_read * fp.expert_bytes + len(chunks) * fused_shared_bytes,
        "FP8 GEMM": len(chunks) * fp8_dense_params,
        "bf16 GEMM / GEMV": len(chunks) * per_chunk + fp.lm_head_bytes,
    }
    return floor_flops, floor_bytes
