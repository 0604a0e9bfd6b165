"""Correct fp32 -> fp8 and fp32 -> bf16 rounding (and bf16 dot operands) in Triton's CPU
interpreter, so that kernels run under ``TRITON_INTERPRET=1`` are checked against the rounding the
GPU does rather than a widened tolerance.

Triton's interpreter converts fp32 to fp8 wrongly: ties round away from zero and a rounding carry
into the exponent is dropped, so 127.97 becomes 64 (triton PR #11897). It truncates fp32 to bf16
(``x.to(tl.bfloat16)`` and stores of fp32 into bf16), where GPUs round to nearest even: half of
all values land one bf16 ulp toward zero (Triton 3.9). And its ``tl.dot`` multiplies bf16
operands as their raw 16-bit patterns (it stores bf16 as uint16). ``install()`` routes those
conversions through torch's correctly rounded cast and widens bf16 dot operands to fp32 (exact)
first. Users: the test session (tests/conftest.py), the gloo TP test workers (tests/gloo_tp2.py,
fresh processes that do not inherit the parent's patch) and the kernel benchmarks' dry runs on a
CPU. Nothing in the serving path imports it.
"""

from collections.abc import Callable

import numpy as np
import torch


def install() -> Callable[[], None]:
    """Patch the interpreter's float conversion; returns a function that restores it. Where the
    patch is already in place (a test session calling a benchmark's dry run, which installs it
    too) it changes nothing and returns a function that does nothing."""
    import triton.language as tl
    from triton.runtime import interpreter

    original = interpreter._convert_float
    if getattr(original, "_rounds_like_torch", False):
        return lambda: None
    targets = {
        tl.float8e4nv: (torch.float8_e4m3fn, torch.uint8),
        tl.float8e4b8: (torch.float8_e4m3fnuz, torch.uint8),
        tl.bfloat16: (torch.bfloat16, torch.uint16),
    }

    def convert(input, input_dtype, output_dtype, rounding_mode):
        target = targets.get(output_dtype)
        if target is None or input_dtype != tl.float32:
            return original(input, input_dtype, output_dtype, rounding_mode)
        values = torch.from_numpy(np.ascontiguousarray(input).view(np.float32))
        return values.to(target[0]).view(target[1]).numpy().reshape(input.shape)

    convert._rounds_like_torch = True
    interpreter._convert_float = convert

    builder = interpreter.InterpreterBuilder
    original_dot = builder.create_dot

    def create_dot(self, a, b, d, input_precision, max_num_imprecise_acc):
        def widened(x):
            if x.dtype.scalar != tl.bfloat16:
                return x
            bits = x.data.astype(np.uint32) << 16  # bf16 is the top half of an fp32
            return interpreter.TensorHandle(bits.view(np.float32), tl.float32)

        return original_dot(self, widened(a), widened(b), d, input_precision, max_num_imprecise_acc)

    builder.create_dot = create_dot

    def restore() -> None:
        interpreter._convert_float = original
        builder.create_dot = original_dot

    return restore
