"""The gated activations that the Triton expert kernels (experts_triton.py,
experts_triton_grouped.py) apply in their gate/up epilogue: SiLU (`SiluAndMul`, Kimi-Linear) and
Kimi-K3's SiTU (`SituAndMul`, vllm/model_executor/layers/activation.py).

``fused_activation(act_and_mul)`` (host) says whether a kernel can fuse the module and with which
constants: a `FusedActivation` (`kind`, `beta`, `linear_beta`) or None. Exact types only: a
subclass may change `forward`, which the kernels would not follow.

``gated_product(acc_gate, acc_up, dtype, ACT, beta, linear_beta)`` (in a kernel) maps the fp32 GEMM
accumulators of one tile to the stored activation, in `dtype`, at the references' rounding points:
both accumulators are first rounded to `dtype` (the references' GEMM outputs), then

- SiLU (`ACT` = `SILU`): `silu(gate)` in fp32 as `gate / (1 + exp(-gate))`, rounded to `dtype`
  (torch's `F.silu` on a 16-bit tensor), times `up` in fp32, rounded;
- SiTU (`ACT` = `SITU`): `beta * tanh(gate / beta) * sigmoid(gate) * (linear_beta * tanh(up /
  linear_beta))` in fp32 with `SituAndMul`'s operations in its order, rounded once.

On the GPU Triton's fp32 division and `exp` are approximate (`div.full`, `ex2.approx`), where
torch's are IEEE division and `expf`: the fp32 values before the last rounding may differ by a few
ulps, which moves a bf16 result by one ulp where they straddle a rounding boundary.

`tanh` is libdevice's (`tanhf`) on the GPU; Triton's CPU interpreter has no libdevice, so there it
is `(1 - e) / (1 + e)` with `e = exp(-2|x|)` and x's sign, within a few fp32 ulps of 1 above |x|
of about 0.5 and a few 1e-7 absolute below: far inside the bf16 rounding of the product, and
within the tests' fp32 tolerances for O(1) outputs.
"""

from typing import NamedTuple

import torch

from vllm.model_executor.layers.activation import SiluAndMul, SituAndMul
from vllm.triton_utils import triton_interpreting

try:
    import triton
    import triton.language as tl
    from triton.language.extra import libdevice
except ImportError:  # CPU-only installs without Triton never launch the expert kernels
    triton = None

__all__ = ["SILU", "SITU", "FusedActivation", "fused_activation"]

SILU, SITU = 0, 1


class FusedActivation(NamedTuple):
    """A kernel's `ACT` constexpr and its runtime constants (unused by SiLU)."""

    kind: int
    beta: float = 1.0
    linear_beta: float = 1.0


def fused_activation(act_and_mul: torch.nn.Module) -> FusedActivation | None:
    """The kernels' form of `act_and_mul`, or None where they do not fuse it."""
    if type(act_and_mul) is SiluAndMul:
        return FusedActivation(SILU)
    if type(act_and_mul) is SituAndMul:
        return FusedActivation(SITU, float(act_and_mul.beta), float(act_and_mul.linear_beta))
    return None


if triton is not None:
    # Fixed at import, as `@triton.jit` chooses between compiling and interpreting then.
    _LIBDEVICE_TANH = tl.constexpr(not triton_interpreting())
    _SITU = tl.constexpr(SITU)

    @triton.jit
    def _tanh(x):
        if _LIBDEVICE_TANH:
            return libdevice.tanh(x)
        e = tl.exp(-2.0 * tl.abs(x))
        t = (1.0 - e) / (1.0 + e)
        return tl.where(x < 0, -t, t)

    @triton.jit
    def gated_product(acc_gate, acc_up, dtype: tl.constexpr, ACT: tl.constexpr, beta, linear_beta):
        """`act(gate) * up` of fp32 accumulator tiles, in `dtype` (module docstring)."""
        gate = acc_gate.to(dtype).to(tl.float32)
        up = acc_up.to(dtype).to(tl.float32)
        if ACT == _SITU:
            soft_gate = beta * _tanh(gate / beta) * (1.0 / (1.0 + tl.exp(-gate)))
            return (soft_gate * (linear_beta * _tanh(up / linear_beta))).to(dtype)
        act = (gate / (1.0 + tl.exp(-gate))).to(dtype).to(tl.float32)
        return (act * up).to(dtype)
