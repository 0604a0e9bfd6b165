"""Correct fp32 -> fp8 rounding for Triton's CPU interpreter, for pytest and spawned workers.

Triton's interpreter (``TRITON_INTERPRET=1``) converts fp32 to fp8 wrongly: ties round away from
zero and a rounding carry into the exponent is dropped, so 127.97 becomes 64 (triton PR #11897).
``install()`` routes those conversions through torch's correctly rounded cast, so the kernels are
checked against the true FP8 rounding rather than a widened tolerance. The test session installs
it (tests/conftest.py) and so do the gloo TP workers (tests/gloo_tp2.py), which are fresh
processes that do not inherit the parent's patch.
"""

from collections.abc import Callable

import numpy as np
import torch


def install() -> Callable[[], None]:
    """Patch the interpreter's float conversion; returns a function that restores it."""
    import triton.language as tl
    from triton.runtime import interpreter

    original = interpreter._convert_float
    fp8_targets = {tl.float8e4nv: torch.float8_e4m3fn, tl.float8e4b8: torch.float8_e4m3fnuz}

    def convert(input, input_dtype, output_dtype, rounding_mode):
        target = fp8_targets.get(output_dtype)
        if target is None or input_dtype != tl.float32:
            return original(input, input_dtype, output_dtype, rounding_mode)
        values = torch.from_numpy(np.ascontiguousarray(input).view(np.float32))
        return values.to(target).view(torch.uint8).numpy().reshape(input.shape)

    interpreter._convert_float = convert

    def restore() -> None:
        interpreter._convert_float = original

    return restore
