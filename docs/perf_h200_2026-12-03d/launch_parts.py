"""Host microseconds of the fused op's call, piece by piece (twentieth session probe).

Run from the repository root on a GPU: ``python docs/perf_h200_2026-12-03d/launch_parts.py``.
"""

import statistics
import time

import torch
from triton.runtime import driver

import vllm.triton_utils.launch as L
from vllm.model_executor.layers.quantization.utils.fp8_per_token import (
    fp8_outputs,
    use_triton_fp8,
)
from vllm.models.kimi_k3.amd.ops import rmsnorm_gated_fp8_per_token as m
from vllm.platforms import current_platform
from vllm.triton_utils.pdl import use_pdl


def us(f, n=3000):
    """(best, median) of 7 loops of n calls, us per call."""
    for _ in range(300):
        f()
    torch.cuda.synchronize()
    times = []
    for _ in range(7):
        t = time.perf_counter()
        for _ in range(n):
            f()
        times.append((time.perf_counter() - t) / n * 1e6)
        torch.cuda.synchronize()
    return min(times), statistics.median(times)


g = torch.Generator(device="cuda").manual_seed(0)
x = torch.randn(1, 12, 128, device="cuda", generator=g).bfloat16()
gate = torch.randn(1, 2 * 1536, device="cuda", generator=g).bfloat16()[:, :1536].view(1, 12, 128)
w = torch.randn(128, device="cuda", generator=g).bfloat16()
q = torch.empty(1, 1536, dtype=current_platform.fp8_dtype(), device="cuda")
s = torch.empty(1, 1, device="cuda")
fp8_max, min_scale = current_platform.fp8_max(), current_platform.fp8_min_scale()
cfg = m.fused_launch_config(1, 12, 128)
spec = m.fused_launch_spec(cfg, 12, 128, use_pdl(x.device))
args = (x, gate, w, q, s, *x.stride()[:2], *gate.stride()[:2], q.stride(0), s.stride(0), 1e-6,
        fp8_max, min_scale)  # fmt: skip
m.launch_fused(x, w, gate, 1e-6, q, s, fp8_max, min_scale, cfg)
m.launch_fused(x, w, gate, 1e-6, q, s, fp8_max, min_scale, cfg)
(entry,) = spec.compiled.values()
compiled, constexprs, function = entry.compiled, entry.constexprs, entry.function
launcher = compiled.run
dev = driver.active.get_current_device()
stream = driver.active.get_current_stream(dev)
values = tuple(a.data_ptr() if isinstance(a, torch.Tensor) else a for a in args)
packed = compiled.packed_metadata
rows = {
    "op (outputs given)": lambda: m.rmsnorm_gated_fp8_per_token(
        x, w, gate, 1e-6, out=q, scale_out=s
    ),
    "op (allocating)": lambda: m.rmsnorm_gated_fp8_per_token(x, w, gate, 1e-6),
    "launch_fused": lambda: m.launch_fused(x, w, gate, 1e-6, q, s, fp8_max, min_scale, cfg),
    "launch()": lambda: L.launch(m._rmsnorm_gated_fp8_kernel, (1, 1, 1), args, spec),
    "launcher __call__": lambda: launcher(
        1, 1, 1, stream, function, packed, None, None, None, *values, *constexprs
    ),
    "cached run (+head)": lambda: entry.run(
        1, 1, 1, stream, function, *entry.head, *values, *constexprs
    ),
    "get_current_device": driver.active.get_current_device,
    "get_current_stream": lambda: driver.active.get_current_stream(dev),
    "check inputs": lambda: m._check_fused_inputs(x, w, gate, 1e-6),
    "fp8_outputs given": lambda: fp8_outputs(q, s, 1, 1536, q.dtype, x.device),
    "use_triton_fp8": lambda: use_triton_fp8(x.device, q.dtype),
    "use_pdl": lambda: use_pdl(x.device),
    "torch.empty": lambda: torch.empty(1, 1536, dtype=q.dtype, device="cuda"),
    "x.device": lambda: x.device,
}
print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}")
print(f"cached run is the C launch: {entry.run is getattr(launcher, 'launch', None)}")
for name, f in rows.items():
    best, median = us(f)
    print(f"{name:>22}: best {best:7.2f} us, median {median:7.2f} us")
