"""SiluAndMul, `silu(gate) * up` over the two halves of a `[..., 2 * I]` input, in one Triton launch
instead of torch's chunk, silu and mul (two passes over the input and a temporary).

``silu_and_mul(x)``
    ``x``: ``[..., 2 * I]`` (gate | up), bf16 / fp16 / fp32 for the kernel, unit stride on the
    last dim (a 2-D ``x`` may have any row stride); other floating dtypes (fp64) take the
    reference on every device. Returns ``[..., I]`` in ``x``'s dtype, contiguous.

Numerics: the torch reference below (``silu_and_mul_ref``, what ``SiluAndMul`` computed before) is
the statement. torch evaluates ``F.silu`` in fp32 for 16-bit inputs, as ``gate / (1 + exp(-gate))``
with an IEEE division, and rounds it to ``x``'s dtype; the product with ``up`` is again computed in
fp32 (exact for two 16-bit values) and rounded once. The kernel makes the same roundings, divides
with ``div_rn`` (Triton's ``/`` is approximate in fp32 on NVIDIA) and takes ``exp`` from libdevice
(``__nv_expf``, the function torch's CUDA build calls; ``tl.exp`` is a faster approximation) with
denormals kept (``enable_reflect_ftz=False``: torch's nvcc build does not flush them). On a CUDA
GPU the result is then the reference's, bit for bit. Triton's CPU interpreter has no libdevice:
there the kernel uses ``tl.exp`` (numpy's ``exp``), which may differ from torch's CPU ``exp`` by an
fp32 ulp, so the tests compare it with the reference evaluated with numpy's ``exp``.

Launch shape: grid ``(rows, cdiv(I, BLOCK))``, ``BLOCK = min(next_pow2(I), 1024)`` lanes of 8
elements per thread (16-byte loads of bf16). Rows are the flattened leading dims; zero rows launch
nothing. On a GPU the kernel runs; on CPU the reference, unless ``TRITON_INTERPRET=1``
(``vllm.triton_utils.use_triton``). No host reads of tensor values: CUDA-graph capturable.
"""

from functools import cache

import torch
import torch.nn.functional as F

from vllm.triton_utils import cdiv, next_power_of_2, triton_interpreting, use_triton
from vllm.triton_utils.launch import LaunchSpec, launch
from vllm.triton_utils.pdl import pdl_options, use_pdl

try:
    import triton
    import triton.language as tl
    from triton.language.extra import libdevice

    from vllm.triton_utils.pdl import pdl_wait
except ImportError:  # CPU-only installs without Triton use the torch reference
    triton = None

__all__ = ["KERNEL_DTYPES", "silu_and_mul", "silu_and_mul_ref"]

KERNEL_DTYPES = frozenset((torch.bfloat16, torch.float16, torch.float32))
# Lanes per program: 8 elements per thread over 4 warps.
_MAX_BLOCK = 1024


# --------------------------------------------------------------------------------------------
# Triton kernel
# --------------------------------------------------------------------------------------------

if triton is not None:
    # Fixed at import, as `@triton.jit` chooses between compiling and interpreting then.
    _LIBDEVICE_EXP = tl.constexpr(not triton_interpreting())

    @triton.jit
    def _silu_and_mul_kernel(
        x_ptr, out_ptr,
        inter, stride_x, stride_out,
        BLOCK: tl.constexpr,
        PDL: tl.constexpr = False,
    ):  # fmt: skip
        pdl_wait(PDL)
        row = tl.program_id(0).to(tl.int64)
        cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
        mask = cols < inter
        gate_ptrs = x_ptr + row * stride_x + cols
        gate = tl.load(gate_ptrs, mask=mask, other=0.0).to(tl.float32)
        up = tl.load(gate_ptrs + inter, mask=mask, other=0.0).to(tl.float32)
        dtype = out_ptr.dtype.element_ty
        # torch's rounding points: silu rounded to the dtype, then the product rounded.
        if _LIBDEVICE_EXP:
            e = libdevice.exp(-gate)
        else:
            e = tl.exp(-gate)
        act = tl.math.div_rn(gate, 1.0 + e).to(dtype).to(tl.float32)
        tl.store(out_ptr + row * stride_out + cols, (act * up).to(dtype), mask=mask)


@cache
def _spec(block: int, pdl: bool) -> LaunchSpec:
    """Constexprs and options for ``block`` lanes; cached: the spec holds the compiled kernels."""
    return LaunchSpec(
        BLOCK=block, num_warps=max(block // 256, 1), enable_reflect_ftz=False, **pdl_options(pdl)
    )


# --------------------------------------------------------------------------------------------
# Torch reference
# --------------------------------------------------------------------------------------------


def silu_and_mul_ref(x: torch.Tensor) -> torch.Tensor:
    """``F.silu(gate) * up`` with ``gate, up = x.chunk(2, dim=-1)``, in ``x``'s dtype."""
    gate, up = x.chunk(2, dim=-1)
    return F.silu(gate) * up


# --------------------------------------------------------------------------------------------
# Validation and public op
# --------------------------------------------------------------------------------------------


def _check(x: torch.Tensor) -> None:
    if not isinstance(x, torch.Tensor):
        raise ValueError(f"x must be a torch.Tensor, got {type(x).__name__}")
    if not x.dtype.is_floating_point:
        raise ValueError(f"x must be a floating-point tensor, got {x.dtype}")
    if x.dim() == 0:
        raise ValueError("x must have at least one dim [..., 2 * I], got a scalar")
    if x.shape[-1] % 2:
        raise ValueError(f"x's last dim (gate | up) must be even, got {x.shape[-1]}")
    if x.stride(-1) != 1 and x.shape[-1] > 1:
        raise ValueError(f"x must have unit stride on its last dim, got strides {x.stride()}")


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    """``silu(gate) * up`` of ``x`` ``[..., 2 * I]`` -> ``[..., I]`` (module docstring)."""
    _check(x)
    if not use_triton(x.device) or x.dtype not in KERNEL_DTYPES:
        return silu_and_mul_ref(x)
    inter = x.shape[-1] // 2
    out = torch.empty((*x.shape[:-1], inter), dtype=x.dtype, device=x.device)
    x2 = x if x.dim() == 2 else x.reshape(-1, x.shape[-1])
    rows = x2.shape[0]
    if rows == 0 or inter == 0:
        return out
    block = min(next_power_of_2(inter), _MAX_BLOCK)
    launch(
        _silu_and_mul_kernel, (rows, cdiv(inter, block), 1),
        (x2, out, inter, x2.stride(0), inter),
        _spec(block, use_pdl(x.device)),
    )  # fmt: skip
    return out
