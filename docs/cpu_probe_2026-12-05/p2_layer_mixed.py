"""Probe 2: the KDA layer's steps (prefill-only and mixed) with kda_prefill's GPU branch (fla-core's
chunk_kda, raw gate in kernel) forced on CPU tensors under TRITON_INTERPRET=1, against the same
steps on the CPU reference branch. Compares every step's output and, after every step, the ssm and
conv state of every slot (touched: close; untouched: bit-identical to before the step).

The branch is chosen by `q.is_cuda` in kda_core.kda_prefill; the narrowest lever is to hand
kda_prefill a `q` that reports `is_cuda` (a Tensor subclass with torch-function dispatch disabled,
so `q.unsqueeze(0)` and everything fla sees is a plain CPU tensor).

Run: OMP_NUM_THREADS=1 TRITON_INTERPRET=1 PYTHONPATH=.:docs/cpu_probe_2026-12-05:/tmp/fla_site \
     python docs/cpu_probe_2026-12-05/p2_layer_mixed.py [fp32|bf16] [lb|softplus] [full|low]
"""

import sys

import interp_patch  # noqa: F401  (autotune without benchmarks, range, bf16 rounding)
import torch

sys.path.insert(0, "tests/models/kimi_k3")
import fla.ops.kda as fla_kda  # noqa: E402
from engine_harness import EngineHarness, SingleLayer  # noqa: E402

import vllm.models.kimi_k3.amd.kda as kda_module  # noqa: E402
from vllm.models.kimi_k3.amd.kda import KimiK3DeltaAttention  # noqa: E402

dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[
    sys.argv[1] if len(sys.argv) > 1 else "fp32"
]
lower_bound = -5.0 if (sys.argv[2] if len(sys.argv) > 2 else "lb") == "lb" else None
full_rank = (sys.argv[3] if len(sys.argv) > 3 else "full") == "full"
HEAD_DIM = int(sys.argv[4]) if len(sys.argv) > 4 else 32
HIDDEN, HEADS, SLOTS = 64, 2, 8
# Launch heuristics as on a GPU of this many SMs (fused_kda_decode's config; 1 is the CPU's).
SMS = int(sys.argv[5]) if len(sys.argv) > 5 else 1
if SMS != 1:
    import vllm.models.kimi_k3.amd.ops.fused_kda_decode as fkd

    fkd.num_sms = lambda device=None: SMS
    _cfg = fkd.kda_decode_config
    configs_seen = []

    def _seen(*a):
        configs_seen.append(_cfg(*a))
        return configs_seen[-1]

    fkd.kda_decode_config = _seen

# (sequence id -> new tokens), decodes first; the harness makes leading one-token continuations
# decodes. Slot 7 is never used (untouched throughout).
STEPS = [
    {0: 5, 1: 7, 2: 3},  # prefill only
    {0: 1, 1: 1, 2: 70, 3: 66},  # mixed: 2 decodes, a continued and a new prefill
    {3: 1, 0: 1, 2: 1, 1: 64, 4: 1},  # mixed: 3 decodes, a 64-token chunk, a 1-token prompt
    {4: 1, 3: 1, 1: 1, 0: 1, 2: 1},  # decode only
    {1: 1, 5: 33},  # mixed: 1 decode, a new prefill
]


def build_layer():
    layer = KimiK3DeltaAttention(
        HIDDEN,
        HEADS,
        HEAD_DIM,
        full_rank_gate=full_rank,
        gate_lower_bound=lower_bound,
        norm_eps=1e-5,
        params_dtype=dtype,
        prefix="probe",
    )
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, p in layer.named_parameters():
            if name == "A_log":
                p.copy_(torch.log(torch.empty(p.shape).uniform_(1, 16, generator=gen)))
            elif name == "dt_bias":
                p.copy_(torch.randn(p.shape, generator=gen) * 0.5)
            elif name.startswith("o_norm"):
                p.copy_(1 + 0.1 * torch.randn(p.shape, generator=gen))
            else:
                p.copy_(torch.randn(p.shape, generator=gen) / p.shape[-1] ** 0.5)
    for module in layer.modules():
        if hasattr(module, "process_weights_after_loading"):
            module.process_weights_after_loading()
    return layer


class _LooksCuda(torch.Tensor):
    __torch_function__ = torch._C._disabled_torch_function_impl

    @property
    def is_cuda(self):
        return True


fla_calls, ref_decode_calls = [], []
_real_chunk_kda = fla_kda.chunk_kda


def _counting_chunk_kda(*args, **kwargs):
    assert all(type(a) is torch.Tensor for a in args if isinstance(a, torch.Tensor))
    fla_calls.append(
        {
            k: (tuple(v.shape), v.dtype) if isinstance(v, torch.Tensor) else v
            for k, v in kwargs.items()
        }
    )
    return _real_chunk_kda(*args, **kwargs)


fla_kda.chunk_kda = _counting_chunk_kda
_real_prefill = kda_module.kda_prefill


def run(force_gpu_branch: bool, decode_ref: bool = False):
    import vllm.models.kimi_k3.amd.ops.fused_kda_decode as fkd

    real_use_triton = fkd.use_triton
    if decode_ref:  # the decode rows through fused_kda_decode_ref (torch ops), not the kernel
        fkd.use_triton = lambda device: False
        real_ref = fkd.fused_kda_decode_ref

        def counted_ref(*a, **kw):
            ref_decode_calls.append(a[0].shape[0])
            return real_ref(*a, **kw)

        fkd.fused_kda_decode_ref = counted_ref
    layer = build_layer()
    harness = EngineHarness(
        SingleLayer(layer, dtype),
        num_blocks=256,
        num_kda_slots=SLOTS,
        max_num_tokens=512,
        max_blocks_per_seq=64,
    )
    pool = harness.kda_pools[0]
    gen = torch.Generator().manual_seed(1)
    pool.ssm_state.copy_(torch.randn(pool.ssm_state.shape, generator=gen) * 0.1)
    pool.conv_state.copy_(torch.randn(pool.conv_state.shape, generator=gen).to(dtype))
    if force_gpu_branch:
        kda_module.kda_prefill = lambda q, *a, **kw: _real_prefill(
            q.as_subclass(_LooksCuda), *a, **kw
        )
    else:
        kda_module.kda_prefill = _real_prefill
    outs, states, kinds = [], [], []
    n0 = len(fla_calls)
    try:
        with torch.no_grad():
            for step in STEPS:
                meta = harness.schedule(step).kda
                kinds.append(
                    (meta.num_decodes, meta.num_prefills, [harness.slots[s] for s in step])
                )
                before = (pool.ssm_state.clone(), pool.conv_state.clone())
                x = torch.randn(sum(step.values()), HIDDEN, generator=gen).to(dtype)
                outs.append(layer(x, meta).float())
                states.append((before, pool.ssm_state.clone(), pool.conv_state.clone()))
    finally:
        kda_module.kda_prefill = _real_prefill
        fkd.use_triton = real_use_triton
        if decode_ref:
            fkd.fused_kda_decode_ref = real_ref
    return outs, states, kinds, len(fla_calls) - n0


def err(a, b):
    a, b = a.double(), b.double()
    return (a - b).abs().max().item(), ((a - b).norm() / b.norm()).item()


ref = run(False, decode_ref="refdecode" in sys.argv)
got = run(True)
if "refdecode" in sys.argv:
    print(
        "reference run: CPU kda_prefill branch AND fused_kda_decode_ref for the decode rows;"
        f" its calls (rows): {ref_decode_calls}"
    )
print(
    f"dtype={dtype} lower_bound={lower_bound} full_rank_gate={full_rank} "
    f"head_dim={HEAD_DIM} sms={SMS}"
)
if SMS != 1:
    print("decode configs chosen inside fused_kda_decode:", sorted(set(map(str, configs_seen))))
print(f"chunk_kda calls: reference run {ref[3]}, forced-GPU run {got[3]}")
for call in fla_calls[:2]:
    print("  chunk_kda kwargs:", call)
worst = {"out": 0.0, "ssm": 0.0, "conv": 0.0}
ok_untouched = True
for i, (kind, o_r, o_g, s_r, s_g) in enumerate(
    zip(ref[2], ref[0], got[0], ref[1], got[1], strict=False)
):
    (before_r, ssm_r, conv_r), (before_g, ssm_g, conv_g) = s_r, s_g
    touched = kind[2]
    nd = kind[0]
    e_dec = err(o_g[:nd], o_r[:nd]) if nd else (0, 0)
    e_pre = err(o_g[nd:], o_r[nd:]) if kind[1] else (0, 0)
    line = (
        f"step {i} (decodes {nd}, prefills {kind[1]}, slots {touched}): "
        f"out decode rows max_abs={e_dec[0]:.2e} rel={e_dec[1]:.2e}; "
        f"prefill rows max_abs={e_pre[0]:.2e} rel={e_pre[1]:.2e}"
    )
    print(line)
    worst["out"] = max(worst["out"], e_dec[1], e_pre[1])
    for s in touched:
        es, ec = err(ssm_g[s], ssm_r[s]), err(conv_g[s], conv_r[s])
        worst["ssm"], worst["conv"] = max(worst["ssm"], es[1]), max(worst["conv"], ec[1])
        changed = not torch.equal(ssm_g[s], before_g[0][s])
        print(
            f"    slot {s}: ssm max_abs={es[0]:.2e} rel={es[1]:.2e} (changed: {changed}); "
            f"conv max_abs={ec[0]:.2e} rel={ec[1]:.2e}"
        )
    for s in range(SLOTS):
        if s in touched:
            continue
        for name, new, old in (
            ("ssm", ssm_g, before_g),
            ("conv", conv_g, before_g),
            ("ssm(ref)", ssm_r, before_r),
        ):
            prev = old[0] if name.startswith("ssm") else old[1]
            if not torch.equal(new[s], prev[s]):
                ok_untouched = False
                print(f"    UNTOUCHED slot {s} {name} CHANGED")
print("untouched slots bit-identical across every step (both runs):", ok_untouched)
print("worst rel errors:", {k: f"{v:.2e}" for k, v in worst.items()})
