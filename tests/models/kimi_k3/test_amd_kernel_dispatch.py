"""A tiny Kimi-K3 model with the PTPC recipe runs the fork's Triton kernels (under the interpreter
on CPU), not their torch references: a prefill launches the fused epilogue of every KDA layer and
the MLA o_proj's per-token quantization, a decode the fused KDA decode kernel with its quantizing
epilogue; every RMSNorm call is one launch of the RMSNorm kernel, except the MLA layers'
`kv_a_layernorm`, which their one cache-write launch applies. A tiny Kimi-Linear (the standard
residual) decoding one token runs each MoE layer's post-attention norm inside its router's
launch, and where the one-row GEMV's launch allows it each KDA layer's input norm inside its input
projection's launch."""

from dataclasses import replace

import pytest
import torch
from engine_harness import EngineHarness as Harness

import vllm.model_executor.kernels.linear.gemv as gemv_op
import vllm.model_executor.kernels.linear.gemv_config as gemv_cfg
import vllm.model_executor.kernels.linear.rms_norm_gemv as norm_gemv_mod
import vllm.models.kimi_k3.amd.kda as kda_mod
import vllm.models.kimi_k3.amd.moe as moe_mod
from vllm.config.quantization import parse_quantization_config
from vllm.model_executor.kernels.linear.gemv_config import WIDE_TILE, GemvConfig
from vllm.model_executor.layers.layernorm import RMSNorm
from vllm.model_executor.layers.ops.rms_norm import row_tile_warps
from vllm.model_executor.layers.quantization.online.base import OnlineQuantizationConfig
from vllm.model_executor.model_loader.loader import load_model
from vllm.triton_utils import next_power_of_2

pytestmark = pytest.mark.usefixtures("interpreter_moe_blocks")

PTPC = OnlineQuantizationConfig(
    parse_quantization_config(
        {"linear": "fp8_per_channel", "ignore": ["re:(?!.*self_attn\\.o_proj$).*"]}
    )
)


def test_tiny_model_prefill_and_decode_launch_the_triton_kernels(triton_launches):
    model = load_model("kimi-k3-tiny", dtype=torch.bfloat16, quant_config=PTPC)
    harness = Harness(model)
    text = getattr(model, "language_model", model)
    kda_layers = sum(layer.is_kda for layer in text.layers)
    mla_layers = len(text.layers) - kda_layers
    gen = torch.Generator().manual_seed(8)
    prompts = {0: torch.randint(0, 100, (5,), generator=gen).tolist(), 1: [3, 4, 5]}
    logits = harness.step(prompts)
    fused = triton_launches["_rmsnorm_gated_fp8_kernel"]
    fused += triton_launches["_rmsnorm_gated_fp8_wide_kernel"]
    assert fused == kda_layers and triton_launches["_fused_kda_decode_kernel"] == 0
    # the MLA o_proj quantizes its own input (the KDA ones receive the fused op's output)
    assert triton_launches["_per_token_fp8_quant_kernel"] == mla_layers
    # one launch per RMSNorm call, the residual adds fused in
    norms = _counted_norms(text)
    assert triton_launches["_rms_norm_kernel"] == norms
    assert triton_launches["_mla_cache_write_kernel"] == mla_layers
    next_tokens = logits.argmax(-1).tolist()
    harness.step({0: [next_tokens[4]], 1: [next_tokens[7]]})
    assert triton_launches["_fused_kda_decode_kernel"] == kda_layers
    # the KDA decode epilogue quantizes for o_proj itself: only the MLA layers launch the quant
    assert triton_launches["_kda_decode_epilogue_kernel"] == kda_layers
    assert triton_launches["_per_token_fp8_quant_kernel"] == 2 * mla_layers
    assert triton_launches["_rms_norm_kernel"] == 2 * norms
    assert triton_launches["_mla_cache_write_kernel"] == 2 * mla_layers


def _counted_norms(text) -> int:
    """RMSNorm modules called once per step, each by a launch of its own: all but the AttnRes
    norms (their weights go to the mixture) and kv_a_layernorm (the MLA cache write's)."""
    return sum(
        type(m) is RMSNorm and not name.endswith(("res_norm", "kv_a_layernorm"))
        for name, m in text.named_modules()
    )


def test_one_token_decode_norms_in_the_moe_routers_launch(triton_launches, monkeypatch):
    """Kimi-Linear decoding one token: one RMSNorm launch fewer per MoE layer (the norm runs in
    the fused router's launch), and the logits those of the unfused layers bit for bit; two
    tokens keep the norm's launch and the two router launches."""
    model = load_model("kimi-linear-tiny", dtype=torch.bfloat16)
    moe_layers = sum(layer.is_moe for layer in model.layers)
    assert moe_layers and model.config.attn_res_block_size is None
    norms = _counted_norms(model)
    kernels = ("_rms_norm_kernel", "_fused_router_topk_kernel", "_grouped_topk_kernel")

    def decode(batch: dict[int, list[int]]) -> tuple[torch.Tensor, tuple[int, ...]]:
        """Prefill `batch`, then decode one token per sequence: (decode logits, its launches).
        The prefill only writes the state that the decode reads, so its ops run their torch
        references (`use_triton` reads TRITON_INTERPRET at each call): interpreted, the three
        prefills were two thirds of the test, and the test above launches a prefill's kernels."""
        harness = Harness(model)
        with pytest.MonkeyPatch.context() as env:
            env.setenv("TRITON_INTERPRET", "0")
            harness.step(batch)
        before = [triton_launches[k] for k in kernels]
        logits = harness.step({sid: [7] for sid in batch})
        return logits, tuple(triton_launches[k] - b for k, b in zip(kernels, before, strict=True))

    fused, launches = decode({0: [5, 6, 7, 8]})
    assert launches == (norms - moe_layers, moe_layers, 0)
    _, launches = decode({0: [5, 6, 7, 8], 1: [9, 10]})
    assert launches == (norms, 0, moe_layers)
    monkeypatch.setattr(moe_mod, "use_fused_norm_router", lambda *args: False)
    unfused, launches = decode({0: [5, 6, 7, 8]})
    assert launches == (norms, moe_layers, 0)
    assert torch.equal(fused, unfused)


def test_one_token_decode_norms_in_the_kda_projections(triton_launches, launch_constexprs):
    """Kimi-Linear decoding one token with the GPU's dispatch faked on CPU rows: every one-row
    bf16 linear through `gemv` (`use_bf16_gemv` asks for CUDA) in `WIDE_TILE` under the norm
    kernel's warps for its K (the tiny model's weights would take the 4-warp default tiles, which
    no fused launch takes), and the KDA layers' input norms allowed into that launch. One RMSNorm
    launch and one GEMV launch fewer per KDA layer, one fused launch each, and the logits those of
    the norm kernel followed by the GEMV in the same tiles, bit for bit. None of the bf16 GEMV
    launches loads its weight early (gemv.py, "Static weights": measured slower there; the fused
    launch has no such form)."""
    model = load_model("kimi-linear-tiny", dtype=torch.bfloat16)
    kda_layers = sum(layer.is_kda for layer in model.layers)
    assert kda_layers
    kernels = ("_rms_norm_kernel", "_gemv_kernel", "_rms_norm_gemv_kernel")

    def tile(n: int, k: int, *args) -> GemvConfig:
        return replace(WIDE_TILE, num_warps=row_tile_warps(next_power_of_2(k)))

    def one_row(x, weight, *args) -> bool:
        return x.dim() == 2 and x.shape[0] == 1 and x.dtype == weight.dtype == torch.bfloat16

    preloads = launch_constexprs(gemv_op, "PRELOAD")

    def decode(fuse: bool) -> tuple[torch.Tensor, tuple[int, ...]]:
        harness = Harness(model)
        with pytest.MonkeyPatch.context() as env:
            env.setenv("TRITON_INTERPRET", "0")  # the prefill only writes the decode's state
            harness.step({0: [5, 6, 7, 8]})
        with pytest.MonkeyPatch.context() as env:
            env.setattr(gemv_cfg, "use_bf16_gemv", lambda x, w: one_row(x, w))
            env.setattr(gemv_op, "default_config", lambda m, n, k, *args: tile(n, k))
            env.setattr(norm_gemv_mod, "norm_gemv_config", tile)
            if fuse:
                env.setattr(kda_mod, "use_rms_norm_gemv", lambda x, res, nw, w: one_row(x, w))
            before = [triton_launches[k] for k in kernels]
            logits = harness.step({0: [7]})
        return logits, tuple(triton_launches[k] - b for k, b in zip(kernels, before, strict=True))

    unfused, (norms, gemvs, fused_launches) = decode(False)
    assert fused_launches == 0 and gemvs >= kda_layers
    fused, launches = decode(True)
    assert launches == (norms - kda_layers, gemvs - kda_layers, kda_layers)
    assert torch.equal(fused, unfused)
    assert set(preloads) == {False}


def test_kda_layer_takes_only_an_rms_norm():
    model = load_model("kimi-linear-tiny", dtype=torch.bfloat16)
    attn = next(layer for layer in model.layers if layer.is_kda).self_attn
    x = torch.zeros(1, model.config.hidden_size, dtype=torch.bfloat16)
    with pytest.raises(TypeError, match="must be an RMSNorm"):
        attn.forward_with_norm(x, None, torch.nn.LayerNorm(x.shape[1]), None)
