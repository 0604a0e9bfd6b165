"""Host microseconds of the fused op's call, piece by piece (eleventh session probe)."""

import time

import torch
from triton.runtime import driver

import vllm.triton_utils.launch as L
from vllm.model_executor.layers.quantization.utils.fp8_per_token import (
    fp8_outputs,
    fp8_quant_params,
    use_triton_fp8,
)
from vllm.models.kimi_k3.amd.ops import rmsnorm_gated_fp8_per_token as m
from vllm.platforms import current_platform


def us(f, n=3000):
    for _ in range(300):
        f()
    torch.cuda.synchronize()
    best = 1e9
    for _ in range(5):
        t = time.perf_counter()
        for _ in range(n):
            f()
        best = min(best, (time.perf_counter() - t) / n * 1e6)
        torch.cuda.synchronize()
    return best


g = torch.Generator(device="cuda").manual_seed(0)
x = torch.randn(1, 12, 128, device="cuda", generator=g).bfloat16()
gate = torch.randn(1, 2 * 1536, device="cuda", generator=g).bfloat16()[:, :1536].view(1, 12, 128)
w = torch.randn(128, device="cuda", generator=g).bfloat16()
q = torch.empty(1, 1536, dtype=current_platform.fp8_dtype(), device="cuda")
s = torch.empty(1, 1, device="cuda")
fp8_max, min_scale = current_platform.fp8_max(), current_platform.fp8_min_scale()
cfg = m.fused_launch_config(1, 12, 128)
spec = m.fused_launch_spec(cfg, 12, 128)
args = (
    x,
    gate,
    w,
    q,
    s,
    *x.stride()[:2],
    *gate.stride()[:2],
    q.stride(0),
    s.stride(0),
    1e-6,
    fp8_max,
    min_scale,
)
m.launch_fused(x, w, gate, 1e-6, q, s, fp8_max, min_scale, cfg)
(entry,) = spec.compiled.values()
_, compiled, constexprs, run, function, packed = entry
dev = driver.active.get_current_device()
stream = driver.active.get_current_stream(dev)
values = tuple(a.data_ptr() if isinstance(a, torch.Tensor) else a for a in args)
rows = {
    "op (outputs given)": lambda: m.rmsnorm_gated_fp8_per_token(
        x, w, gate, 1e-6, out=q, scale_out=s
    ),
    "op (allocating)": lambda: m.rmsnorm_gated_fp8_per_token(x, w, gate, 1e-6),
    "launch_fused": lambda: m.launch_fused(x, w, gate, 1e-6, q, s, fp8_max, min_scale, cfg),
    "launch()": lambda: L.launch(m._rmsnorm_gated_fp8_kernel, (1, 1, 1), args, spec),
    "run(values)": lambda: run(
        1, 1, 1, stream, function, packed, None, None, None, *values, *constexprs
    ),
    "run(tensors)": lambda: run(
        1, 1, 1, stream, function, packed, None, None, None, *args, *constexprs
    ),
    "get_current_device": driver.active.get_current_device,
    "get_current_stream": lambda: driver.active.get_current_stream(dev),
    "check inputs": lambda: m._check_fused_inputs(x, w, gate, 1e-6),
    "fp8_outputs given": lambda: fp8_outputs(q, s, 1, 1536, q.dtype, x.device),
    "fp8_outputs alloc": lambda: fp8_outputs(None, None, 1, 1536, q.dtype, x.device),
    "use_triton_fp8": lambda: use_triton_fp8(x.device, q.dtype),
    "fp8_quant_params": lambda: fp8_quant_params(None),
    "config+spec": lambda: m.fused_launch_spec(
        m.fused_launch_config(m.next_power_of_2(1), 12, 128), 12, 128
    ),
    "torch.empty": lambda: torch.empty(1, 1536, dtype=q.dtype, device="cuda"),
    "x.device": lambda: x.device,
    "x.data_ptr()": lambda: x.data_ptr(),
}
print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}")
for name, f in rows.items():
    print(f"{name:>22}: {us(f):7.2f} us")
