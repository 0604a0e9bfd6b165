"""A tiny Kimi-K3 model with the PTPC recipe runs the fork's Triton kernels (under the interpreter
on CPU), not their torch references: a prefill launches the fused epilogue of every KDA layer and
the MLA o_proj's per-token quantization, a decode the fused KDA decode kernel with its quantizing
epilogue; every RMSNorm call is one launch of the RMSNorm kernel, except the MLA layers'
`kv_a_layernorm`, which their one cache-write launch applies."""

import pytest
import torch
from engine_harness import EngineHarness as Harness

from vllm.config.quantization import parse_quantization_config
from vllm.model_executor.layers.layernorm import RMSNorm
from vllm.model_executor.layers.quantization.online.base import OnlineQuantizationConfig
from vllm.model_executor.model_loader.loader import load_model

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
    # one launch per RMSNorm call, the residual adds fused in (the AttnRes norms lend only
    # their weights to the mixture, kv_a_layernorm its to the MLA cache write)
    norms = sum(
        type(m) is RMSNorm and not name.endswith(("res_norm", "kv_a_layernorm"))
        for name, m in text.named_modules()
    )
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
