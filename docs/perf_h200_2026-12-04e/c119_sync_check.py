"""Call 119 (run inline; kept as run): does MLA prefill's attention make the host wait for the
device, per path (3000, 4096, 8192: cuDNN's per-length-class plans; 1500: flash)? The second call
per length runs under torch.cuda.set_sync_debug_mode("error"). Output: c119_sync_check.log."""

import warnings

import torch

import vllm  # noqa: F401  (env_override)
from vllm.models.kimi_k3.amd.ops.mla_prefill import mla_prefill_attention

warnings.simplefilter("ignore")
for L in (4096, 3000, 1500, 8192):
    q = torch.randn(L, 32, 192, device="cuda", dtype=torch.bfloat16)
    kv = torch.randn(L, 32, 256, device="cuda", dtype=torch.bfloat16)
    k_nope, v = kv.split([128, 128], dim=-1)
    k_pe = torch.randn(L, 64, device="cuda", dtype=torch.bfloat16)
    mla_prefill_attention(q, k_nope, k_pe, v, 192**-0.5)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        mla_prefill_attention(q, k_nope, k_pe, v, 192**-0.5)
        print(L, "no sync")
    except RuntimeError as e:
        print(L, "SYNC:", str(e)[:150])
    torch.cuda.set_sync_debug_mode(0)
    torch.cuda.synchronize()
