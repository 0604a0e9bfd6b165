"""Correct fp32 -> fp8 / bf16 rounding and bf16 dots for Triton's CPU interpreter, for pytest and
spawned workers.

Triton's interpreter (``TRITON_INTERPRET=1``) gets three things wrong that the kernels rely on:
* fp32 -> fp8: ties round away from zero and a rounding carry into the exponent is dropped, so
  127.97 becomes 64 (triton PR #11897);
* fp32 -> bf16 (a plain ``.to(tl.bfloat16)``, round-to-nearest-even on a GPU) truncates;
* ``tl.dot`` of bf16 operands multiplies their raw uint16 bit patterns (the interpreter stores bf16
  as uint16), so the result is garbage.
``install()`` routes those conversions through torch's correctly rounded cast and computes bf16 dots
from the fp32 values (exact products, fp32 sums, as the tensor cores), so the kernels are checked
against the true rounding rather than a widened tolerance. The test session installs it
(tests/conftest.py) and so do the gloo TP workers (tests/gloo_tp2.py), which are fresh processes
that do not inherit the parent's patch.
"""

from collections.abc import Callable

import numpy as np
import torch


def install() -> Callable[[], None]:
    """Patch the interpreter's float conversion and dot; returns a function that restores them."""
    import triton.language as tl
    from triton._C.libtriton import ir
    from triton.runtime import interpreter

    original_convert = interpreter._convert_float
    original_dot = interpreter.InterpreterBuilder.create_dot
    targets = {
        tl.float8e4nv: (torch.float8_e4m3fn, torch.uint8),
        tl.float8e4b8: (torch.float8_e4m3fnuz, torch.uint8),
        tl.bfloat16: (torch.bfloat16, torch.int16),
    }

    def convert(input, input_dtype, output_dtype, rounding_mode):
        target = targets.get(output_dtype)
        bf16_rtz = output_dtype == tl.bfloat16 and rounding_mode == ir.ROUNDING_MODE.RTZ
        if target is None or input_dtype != tl.float32 or bf16_rtz:
            return original_convert(input, input_dtype, output_dtype, rounding_mode)
        values = torch.from_numpy(np.ascontiguousarray(input).view(np.float32))
        torch_dtype, bits = target
        return values.to(torch_dtype).view(bits).numpy().reshape(input.shape)

    def bf16_as_fp32(handle) -> np.ndarray:
        if handle.dtype != tl.bfloat16:
            return handle.data
        return (handle.data.astype(np.uint32) << 16).view(np.float32)

    def dot(self, a, b, d, input_precision, max_num_imprecise_acc):
        if tl.bfloat16 not in (a.dtype, b.dtype):
            return original_dot(self, a, b, d, input_precision, max_num_imprecise_acc)
        product = np.matmul(bf16_as_fp32(a), bf16_as_fp32(b), dtype=d.data.dtype)
        return interpreter.TensorHandle(product + d.data, d.dtype.scalar)

    interpreter._convert_float = convert
    interpreter.InterpreterBuilder.create_dot = dot

    def restore() -> None:
        interpreter._convert_float = original_convert
        interpreter.InterpreterBuilder.create_dot = original_dot

    return restore
