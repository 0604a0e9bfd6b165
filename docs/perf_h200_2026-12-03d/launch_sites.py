"""Host microseconds per eager call of the ops whose launches went through ``launch()`` in the
twentieth session, with ``launch()``'s fast path on and off (off: every launch through Triton's
``kernel[grid]``, as before), alternating in one process so that both see the host in the same
phase. Kimi-Linear-48B shapes at a 1k-token prefill; the calls a prefill step makes of each.

Run from the repository root on a GPU: ``python docs/perf_h200_2026-12-03d/launch_sites.py``.
``kda_gate_beta``, measured then, was removed in the thirty-first session (no caller is left).
"""

import statistics
import time

import torch

import vllm.triton_utils.launch as L
from vllm.model_executor.layers.fused_moe.group_rows import group_rows
from vllm.model_executor.layers.fused_moe.router import RoutingParams, grouped_topk_triton
from vllm.model_executor.layers.fused_moe.weighted_sum import moe_weighted_sum
from vllm.models.kimi_k3.amd.ops.causal_conv1d import causal_conv1d_prefill
from vllm.models.kimi_k3.amd.ops.mla_prefill import mla_prefill_key

T, E, K, H, HEADS, DK = 1024, 256, 8, 2304, 32, 128
dev = "cuda"
g = torch.Generator(device=dev).manual_seed(0)
logits = torch.randn(T, E, device=dev, generator=g)
bias = torch.randn(E, device=dev, generator=g)
routing = RoutingParams(E, K, routed_scaling_factor=2.446, num_fused_shared_experts=1)
ids = torch.randint(0, E, (T, K + 1), device=dev, generator=g)
y = torch.randn(T * (K + 1), H, device=dev, generator=g).bfloat16()
w = torch.rand(T, K + 1, device=dev, generator=g)
channels = 3 * HEADS * DK
x = torch.randn(T, channels, device=dev, generator=g).bfloat16()
conv_w = torch.randn(channels, 4, device=dev, generator=g).bfloat16()
conv_state = torch.zeros(8, channels, 3, device=dev).bfloat16()
qsl = torch.tensor([0, T], dtype=torch.int32, device=dev)
slots = torch.tensor([0], dtype=torch.int32, device=dev)
has_init = torch.tensor([False], device=dev)
k_nope = torch.randn(T, HEADS, 128, device=dev, generator=g).bfloat16()
k_pe = torch.randn(T, 64, device=dev, generator=g).bfloat16()

# (op, calls per prefill step of the 48B model)
ops = {
    "grouped_topk_triton": (lambda: grouped_topk_triton(logits, bias, routing), 26),
    "group_rows": (lambda: group_rows(ids, E, 128), 26),
    "moe_weighted_sum": (lambda: moe_weighted_sum(y, w, torch.bfloat16), 26),
    "causal_conv1d_prefill": (
        lambda: causal_conv1d_prefill(x, conv_w, conv_state, qsl, slots, has_init),
        20,
    ),
    "mla_prefill_key": (lambda: mla_prefill_key(k_nope, k_pe), 7),
}


def host_us(fn, n=300):
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(n):
        fn()
    elapsed = (time.perf_counter() - t) / n * 1e6
    torch.cuda.synchronize()
    return elapsed


print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}")
for fn, _ in ops.values():  # compile every variant, both paths
    for fast in (True, False):
        L._FAST = fast
        fn()
        fn()
times = {(name, fast): [] for name in ops for fast in (True, False)}
for _ in range(7):
    for name, (fn, _) in ops.items():
        for fast in (True, False):
            L._FAST = fast
            times[name, fast].append(host_us(fn))
L._FAST = True
saved = 0.0
print(f"{'op':>22} {'launch() us':>12} {'kernel[grid] us':>16} {'saved':>7} {'calls/step':>11}")
for name, (_, calls) in ops.items():
    on, off = statistics.median(times[name, True]), statistics.median(times[name, False])
    saved += (off - on) * calls
    print(f"{name:>22} {on:12.1f} {off:16.1f} {off - on:7.1f} {calls:11d}")
print(f"host time saved per 48B prefill step by these launches: {saved / 1000:.2f} ms")
