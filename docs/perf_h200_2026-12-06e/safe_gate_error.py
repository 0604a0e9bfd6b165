"""Forty-fourth run, call 173: how far fla-core's KDA prefill lands from the exact fp32 recurrence
(`kda_recurrent_ref`, on the GPU in fp32 from the same bf16 inputs and the same decay), per path:
the decay precomputed (`kda_gate`, then plain `chunk_kda`), the gate in fla-core's kernel without
`safe_gate`, and with it (the engine's path for a lower-bounded gate since 8f6cc69). Relative
Frobenius error of the output and of the final states, and the largest element error of the
states over their largest magnitude, for the test's case and larger ones."""

import torch
from fla.ops.kda import chunk_kda

from vllm.models.kimi_k3.amd.ops.kda_core import kda_recurrent_ref
from vllm.models.kimi_k3.amd.ops.kda_gate import kda_gate


def case(t, heads, d, lens, seed, lower_bound=-5.0, raw_scale=2.0, bias_scale=0.1):
    gen = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(t, heads, d, generator=gen).cuda().bfloat16() for _ in range(3))
    raw = (torch.randn(t, heads * d, generator=gen) * raw_scale).cuda().bfloat16()
    a_log = torch.log(torch.rand(heads, generator=gen) * 15 + 1).cuda()
    dt_bias = (torch.randn(heads * d, generator=gen) * bias_scale).cuda()
    beta = torch.sigmoid(torch.randn(t, heads, generator=gen).cuda().bfloat16().float())
    start = torch.randn(len(lens), heads, d, d, generator=gen).cuda() * 0.1
    qsl = torch.tensor([0, *lens]).cumsum(0).cuda()
    g = kda_gate(raw, a_log, dt_bias, lower_bound)
    ref_o, ref_s = [], []
    for i in range(len(lens)):
        a, b = int(qsl[i]), int(qsl[i + 1])
        o, s = kda_recurrent_ref(q[a:b], k[a:b], v[a:b], g[a:b], beta[a:b], start[i])
        ref_o.append(o)
        ref_s.append(s)
    ref_o, ref_s = torch.cat(ref_o), torch.stack(ref_s)

    def fla(**kw):
        out, final = chunk_kda(
            q[None],
            k[None],
            v[None],
            kw.pop("g")[None],
            beta[None],
            initial_state=start.clone(),
            output_final_state=True,
            use_qk_l2norm_in_kernel=True,
            cu_seqlens=qsl,
            **kw,
        )
        return out[0].float(), final

    paths = {
        "precomputed": fla(g=g.view(t, heads, d)),
        "in-kernel": fla(
            g=raw.view(t, heads, d),
            use_gate_in_kernel=True,
            A_log=a_log,
            dt_bias=dt_bias,
            lower_bound=lower_bound,
        ),
        "in-kernel safe": fla(
            g=raw.view(t, heads, d),
            use_gate_in_kernel=True,
            A_log=a_log,
            dt_bias=dt_bias,
            lower_bound=lower_bound,
            safe_gate=True,
        ),
    }
    print(f"T {t}, H {heads}, D {d}, lens {lens}, raw x{raw_scale}, bias x{bias_scale}:")
    for name, (o, s) in paths.items():
        eo = float((o - ref_o).norm() / ref_o.norm())
        es = float((s - ref_s).norm() / ref_s.norm())
        em = float((s - ref_s).abs().max() / ref_s.abs().max())
        print(f"  {name:>15}: out {eo:.2e}  state {es:.2e}  state max {em:.2e}")


with torch.inference_mode():
    case(70, 2, 64, [30, 40], 4)
    case(1000, 8, 128, [1000], 1)
    case(2048, 8, 128, [100, 3, 1945], 2)
    case(2048, 8, 128, [2048], 3, raw_scale=4.0, bias_scale=1.0)
