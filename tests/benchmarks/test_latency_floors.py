"""The latency benchmark's per-group floors on Kimi-Linear-48B-A3B (meta build), against counts
made by hand from the published config: each weight belongs to the group whose kernels read it,
and the groups' weight floors add up to the weights of the whole step's floor."""

import math
from pathlib import Path

import pytest
import torch

from vllm.model_executor.model_loader.builtin import resolve_model
from vllm.model_executor.model_loader.loader import build_model
from vllm.models.kimi_k3.amd.footprint import model_footprint
from vllm.transformers_utils.configs import load_model_config

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"

# By hand: hidden 2304, 26 MoE layers, experts of 3 x 2304 x 1024 bf16, one shared expert of
# that size per layer.
EXPERT_PARAMS = 3 * 2304 * 1024
EXPERT_BYTES = 2 * EXPERT_PARAMS
MOE_LAYERS = 26


@pytest.fixture(autouse=True)
def benchmarks_importable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(BENCHMARKS))


def footprint_and_model(monkeypatch: pytest.MonkeyPatch, fuse: str):
    monkeypatch.setenv("VLLM_KIMI_FUSE_SHARED_EXPERTS", fuse)
    config = load_model_config(resolve_model("kimi-linear-48b-a3b")[0])
    model = build_model(config, torch.bfloat16, device="meta")
    return model_footprint(model), model


@pytest.mark.parametrize("fuse", ["1", "0"])
def test_decode_floors_give_the_shared_expert_to_the_kernels_that_read_it(monkeypatch, fuse):
    import group_floors as gf

    fp, model = footprint_and_model(monkeypatch, fuse)
    params, shared = gf.fused_shared_experts(model)
    assert (params, shared) == ((MOE_LAYERS * EXPERT_PARAMS, MOE_LAYERS * EXPERT_BYTES)
                                if fuse == "1" else (0, 0))  # fmt: skip
    fp8 = 27 * 4096 * 2304  # the PTPC recipe's o_proj weights, as a loaded model holds them
    floors = gf.decode_group_floors(fp, [8.0] * MOE_LAYERS, [1024], fp8, shared)
    routed = MOE_LAYERS * 8 * EXPERT_BYTES
    # Fused (the default), the shared expert is one more expert of the routed kernels.
    assert floors["routed experts"] == routed + (MOE_LAYERS * EXPERT_BYTES if fuse == "1" else 0)
    # bf16 weights a batch-1 step reads outside the routed kernels, by hand: KDA (in_proj
    # 2304 x (3 x 4096 + 128 + 128 + 32), f_b and g_b 128 x 4096, o_norm), MLA (q 2304 x 6144,
    # kv_a 2304 x 576, W_UK / W_UV 512 x 8192, kv_a norm), the dense MLP, the layer norms and
    # the final norm, the LM head, the fp32 router, conv taps, A_log and dt_bias; plus the
    # shared expert when it runs as its own MLP.
    bf16 = (
        20 * (2304 * (3 * 4096 + 128 + 128 + 32) + 2 * 128 * 4096 + 128)
        + 7 * (2304 * 6144 + 2304 * 576 + 512 * 8192 + 512)
        + 3 * 2304 * 9216 + 27 * 2 * 2304 + 2304 + 163840 * 2304
    )  # fmt: skip
    fp32 = MOE_LAYERS * (256 * 2304 + 256) + 20 * (3 * 4096 * 4 + 32 + 4096)
    # On meta the o_proj weights are still bf16 (PTPC quantizes them at load): 2 B each.
    dense = 2 * bf16 + 4 * fp32 + 2 * fp8
    assert fp.dense_decode_bytes == dense + MOE_LAYERS * EXPERT_BYTES
    own_mlp = MOE_LAYERS * EXPERT_BYTES if fuse == "0" else 0
    assert floors["bf16 GEMM / GEMV"] == dense - fp8 + own_mlp
    # The weight groups add up to the weights of the step's floor (decode_bytes).
    weights = sum(floors[g] for g in ("routed experts", "FP8 GEMM", "bf16 GEMM / GEMV"))
    state = floors["KDA decode"] + floors["MLA decode"]
    assert weights + fp.embedding_row_bytes == (fp.decode_bytes([8] * MOE_LAYERS, [1024]) - state)


@pytest.mark.parametrize("fuse", ["1", "0"])
def test_prefill_floors_give_the_shared_expert_to_the_kernels_that_run_it(monkeypatch, fuse):
    import group_floors as gf
    from bench_utils import expected_distinct_experts

    fp, model = footprint_and_model(monkeypatch, fuse)
    shared = gf.fused_shared_experts(model)
    length, chunks = 8192, [2048] * 4
    flops, nbytes = gf.prefill_group_floors(fp, length, chunks, 0, False, 0.0, *shared)
    experts = MOE_LAYERS * (8 + (fuse == "1")) * EXPERT_PARAMS
    assert flops["routed experts"] == 2.0 * length * experts
    # Every active parameter's FLOPs are in one group: the body's for every token, the LM head's
    # for the one row that samples.
    total = 2.0 * (fp.active_params_without_lm_head * length + fp.lm_head_params)
    assert math.isclose(sum(flops.values()), total)
    fused_bytes = len(chunks) * MOE_LAYERS * EXPERT_BYTES if fuse == "1" else 0
    # The LM head (163840 x 2304 bf16) is read by the last chunk alone, whose row samples: the
    # other chunks' steps run it on no row. It was counted once per chunk.
    head = 2 * 163840 * 2304
    assert fp.lm_head_bytes == head
    expected = len(chunks) * (fp.dense_decode_bytes - head) + head - fused_bytes
    assert nbytes["bf16 GEMM / GEMV"] == expected
    # Each chunk's routed kernels read the experts it routes to and, fused, the shared expert.
    num_experts = fp.routed_expert_params // (fp.params_per_expert * MOE_LAYERS)
    routed = 4 * expected_distinct_experts(num_experts, 8, 2048) * MOE_LAYERS * EXPERT_BYTES
    assert math.isclose(nbytes["routed experts"], routed + fused_bytes)


@pytest.mark.parametrize("dtype", [torch.float8_e4m3fn, torch.float8_e4m3fnuz])
def test_fp8_weights_count_either_fp8_flavour(dtype):
    """The PTPC o_proj weights are e4m3fnuz on MI300 / MI325: only e4m3fn was counted, so there
    the FP8 group's floors were 0 and its bytes and FLOPs went to the bf16 group's."""
    import group_floors as gf

    config = load_model_config(resolve_model("kimi-linear-tiny")[0])
    model = build_model(config, torch.bfloat16, device="meta")
    projections = [layer.self_attn.o_proj for layer in model.layers]
    for proj in projections:
        proj.weight = torch.nn.Parameter(proj.weight.to(dtype), requires_grad=False)
    count = sum(proj.weight.numel() for proj in projections)
    assert gf.fp8_weights(model) == (count, count, False)
