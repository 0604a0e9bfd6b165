"""Probe 3: kda_core.kda_decode's GPU branch (fla-core's fused_recurrent_kda; reachable only from
fused_kda_decode_ref on a CUDA device, i.e. not from the layer) forced on CPU tensors under
TRITON_INTERPRET=1, against its CPU branch.

Run: OMP_NUM_THREADS=1 TRITON_INTERPRET=1 PYTHONPATH=.:docs/cpu_probe_2026-12-05:/tmp/fla_site \
     python docs/cpu_probe_2026-12-05/p3_kda_decode.py
"""

import interp_patch  # noqa: F401
import torch

from vllm.models.kimi_k3.amd.ops.kda_core import kda_decode
from vllm.models.kimi_k3.amd.ops.kda_gate import kda_gate


class _LooksCuda(torch.Tensor):
    __torch_function__ = torch._C._disabled_torch_function_impl

    @property
    def is_cuda(self):
        return True


for dtype in (torch.float32, torch.bfloat16):
    gen = torch.Generator().manual_seed(0)
    n, h, d, s = 3, 2, 32, 6
    q, k, v = (torch.randn(n, h, d, generator=gen).to(dtype) for _ in range(3))
    g = kda_gate(
        torch.randn(n, h * d, generator=gen),
        torch.rand(h, generator=gen),
        torch.randn(h * d, generator=gen) * 0.5,
        -5.0,
    )
    beta = torch.sigmoid(torch.randn(n, h, generator=gen))
    state0 = torch.randn(s, h, d, d, generator=gen) * 0.1
    slots = torch.tensor([4, 1, 2])
    ref_state, got_state = state0.clone(), state0.clone()
    ref = kda_decode(q, k, v, g, beta, ref_state, slots)
    with torch.no_grad():
        got = kda_decode(q.as_subclass(_LooksCuda), k, v, g, beta, got_state, slots)
    d_out = (got.double() - ref.double()).abs().max().item()
    d_state = (got_state - ref_state).abs().max().item()
    untouched = torch.equal(got_state[[0, 3, 5]], state0[[0, 3, 5]])
    print(
        f"{dtype}: out max_abs={d_out:.2e} (max|ref| {ref.abs().max():.2e}), "
        f"state max_abs={d_state:.2e}, untouched slots equal: {untouched}"
    )
