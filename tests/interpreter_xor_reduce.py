"""A vectorised integer XOR reduction for Triton's CPU interpreter, for pytest and spawned workers.

``tl.sort`` (and so the router's top-k and the grouped experts' row placement) is a bitonic
network whose every compare-and-swap stage finds its partners with ``xor_sum`` along one axis.
The interpreter has numpy fast paths for sum, min and max but runs any other combine function,
``_xor_combine`` included, once per element in Python: a 256-lane sort took ~0.4 s a program,
most of a router test's time. ``install()`` reduces with ``np.bitwise_xor.reduce`` instead.
XOR of integers is associative and commutative, so the result is the element-by-element
fold's bit for bit, and the kernels run exactly as before, only faster. Installed with the FP8
rounding fix (tests/conftest.py, tests/gloo_tp2.py).
"""

from collections.abc import Callable

import numpy as np


def install() -> Callable[[], None]:
    """Patch the interpreter's reduction; returns a function that restores it."""
    import triton.language as tl
    from triton.runtime import interpreter

    ops = interpreter.ReduceOps
    original = ops.apply_impl
    xor_combine = tl.standard._xor_combine

    def apply_impl(self, input):
        if self.combine_fn is not xor_combine:
            return original(self, input)
        (x,) = input  # xor_sum reduces one tensor
        reduced = np.bitwise_xor.reduce(x.handle.data, axis=self.axis, keepdims=self.keep_dims)
        return self.to_tensor(reduced, x.dtype)

    ops.apply_impl = apply_impl

    def restore() -> None:
        ops.apply_impl = original

    return restore
