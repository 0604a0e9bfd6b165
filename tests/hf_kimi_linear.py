"""transformers' Kimi-Linear as an independent reference, for the model and engine tests.

`import_modeling_kimi_linear()` imports transformers' modeling module on its pure-torch path:
transformers binds fla's (and causal_conv1d's) kernels at import whenever those import, and they
fail on CPU, so both are hidden while it is imported. `random_hf_model` builds a random tiny
`KimiLinearForCausalLM` whose `save_pretrained` folder is a checkpoint with the real Kimi names.
"""

import sys
from types import ModuleType

import torch

TINY = dict(
    vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=3,
    num_attention_heads=4, num_key_value_heads=4, kv_lora_rank=32, qk_nope_head_dim=16,
    qk_rope_head_dim=8, v_head_dim=16, q_lora_rank=None, num_experts=8, num_experts_per_token=2,
    moe_intermediate_size=32, num_shared_experts=1, first_k_dense_replace=1, moe_layer_freq=1,
    hidden_act="silu", rms_norm_eps=1e-6, tie_word_embeddings=False, pad_token_id=0,
    bos_token_id=1, eos_token_id=2,
    linear_attn_config={"kda_layers": [1, 3], "full_attn_layers": [2], "num_heads": 2,
                        "head_dim": 32, "short_conv_kernel_size": 4},
)  # fmt: skip


def import_modeling_kimi_linear() -> ModuleType:
    """transformers' `modeling_kimi_linear`, imported with fla and causal_conv1d hidden."""
    hidden = ("fla", "causal_conv1d")
    saved = {k: v for k, v in sys.modules.items() if k.split(".")[0] in hidden}
    for name in hidden:
        sys.modules[name] = None
    try:
        from transformers.models.kimi_linear import modeling_kimi_linear
    finally:
        for name in hidden:
            del sys.modules[name]
        sys.modules.update(saved)
    return modeling_kimi_linear


def random_hf_model(hf_kimi_linear: ModuleType, **changes) -> torch.nn.Module:
    """transformers' KimiLinearForCausalLM of config TINY (with `changes`), fp32, random weights
    at trained-like scales (seed 0)."""
    cfg = hf_kimi_linear.KimiLinearConfig(**dict(TINY, **changes))
    cfg._attn_implementation = "eager"
    torch.manual_seed(0)  # transformers' initializers draw from the global generator
    model = hf_kimi_linear.KimiLinearForCausalLM(cfg).float().eval()
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(("A_log",)):
                p.copy_(torch.log(torch.empty_like(p).uniform_(1, 16, generator=gen)))
            elif name.endswith("dt_bias") or "e_score_correction_bias" in name:
                p.normal_(0, 0.3, generator=gen)
            elif name.endswith("norm.weight"):
                p.copy_(1 + 0.1 * torch.randn(p.shape, generator=gen))
            elif name.endswith("gate.weight") or ".experts." in name:
                p.normal_(0, 0.2, generator=gen)
        for name, b in model.named_buffers():
            if "e_score_correction_bias" in name:
                b.normal_(0, 0.3, generator=gen)
    return model
