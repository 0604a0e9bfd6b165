"""Probe 1: fla-core 0.6.0 chunk_kda on CPU under TRITON_INTERPRET=1, called in exactly the form
kda_core.kda_prefill's GPU branch uses (raw gate in kernel), against our torch reference
kda_prefill (CPU branch, gate applied by kda_gate).

Run: OMP_NUM_THREADS=1 TRITON_INTERPRET=1 PYTHONPATH=.:docs/cpu_probe_2026-12-05:/tmp/fla_site \
     python docs/cpu_probe_2026-12-05/p1_chunk_kda.py [fp32|bf16] [lb|softplus]
"""

import sys
import time

import torch

from vllm.models.kimi_k3.amd.ops.kda_core import KdaGate, _gather_initial, kda_prefill

dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[
    sys.argv[1] if len(sys.argv) > 1 else "fp32"
]
lower_bound = -5.0 if (sys.argv[2] if len(sys.argv) > 2 else "lb") == "lb" else None
lens = [int(x) for x in (sys.argv[3] if len(sys.argv) > 3 else "5,70").split(",")]

import interp_patch  # noqa: E402,F401
from fla.ops.kda import chunk_kda  # noqa: E402

H, D, S = 2, 32, 6
T = sum(lens)
gen = torch.Generator().manual_seed(0)
q = torch.randn(T, H, D, generator=gen).to(dtype)
k = torch.randn(T, H, D, generator=gen).to(dtype)
v = torch.randn(T, H, D, generator=gen).to(dtype)
raw = (torch.randn(T, H, D, generator=gen) * 2).to(dtype)
beta = torch.sigmoid(torch.randn(T, H, generator=gen))
A_log = torch.log(torch.empty(H).uniform_(1, 16, generator=gen))
dt_bias = torch.randn(H * D, generator=gen) * 0.5
state0 = torch.randn(S, H, D, D, generator=gen) * 0.1
qsl = torch.tensor([0] + torch.tensor(lens).cumsum(0).tolist(), dtype=torch.int64)
slots = torch.tensor([4, 1][: len(lens)] + list(range(2, 2 + len(lens) - 2)), dtype=torch.long)
has_init = torch.tensor([True, False, True][: len(lens)])
gate = KdaGate(A_log, dt_bias, lower_bound)

# Reference: our CPU branch.
ref_state = state0.clone()
ref_out = kda_prefill(q, k, v, raw, beta, ref_state, qsl, slots, has_init, gate)

# fla, exactly as kda_prefill's GPU branch calls it.
init = _gather_initial(state0.clone(), slots, has_init)
t0 = time.time()
with torch.no_grad():
    out, final = chunk_kda(
        q.unsqueeze(0),
        k.unsqueeze(0),
        v.unsqueeze(0),
        raw.unsqueeze(0),
        beta.unsqueeze(0),
        initial_state=init,
        output_final_state=True,
        use_qk_l2norm_in_kernel=True,
        cu_seqlens=qsl,
        use_gate_in_kernel=True,
        A_log=A_log,
        dt_bias=dt_bias,
        lower_bound=lower_bound,
    )
print(
    f"chunk_kda ran in {time.time() - t0:.1f}s; out {tuple(out.shape)} {out.dtype}, "
    f"final {tuple(final.shape)} {final.dtype}"
)
out = out.squeeze(0)
fla_state = state0.clone()
fla_state[slots] = final


def errs(a, b):
    a, b = a.double(), b.double()
    d = (a - b).abs()
    return (
        f"max_abs={d.max():.3e} rel_norm={(d.norm() / b.norm()):.3e} max|ref|={b.abs().max():.3e}"
    )


print(f"dtype={dtype} lower_bound={lower_bound} lens={lens}")
for i in range(len(lens)):
    a, b = qsl[i].item(), qsl[i + 1].item()
    print(
        f"  seq {i} (len {b - a}, slot {slots[i].item()}, init {bool(has_init[i])}): out "
        + errs(out[a:b], ref_out[a:b])
    )
    print("     final state: " + errs(fla_state[slots[i]], ref_state[slots[i]]))
untouched = [s for s in range(S) if s not in slots.tolist()]
print(
    "  untouched slots equal state0:", all(torch.equal(fla_state[s], state0[s]) for s in untouched)
)
