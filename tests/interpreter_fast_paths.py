"""Two fast paths for Triton's CPU interpreter, for pytest and spawned workers. Neither changes
what a kernel computes: they skip work whose result the interpreter already has.

Integer XOR reductions. ``tl.sort`` (the grouped experts' row placement) and ``tl.topk`` (the
router's top-k) are bitonic networks whose every compare-and-swap stage finds its partners with
``xor_sum`` along one axis. The interpreter has numpy fast paths for sum, min and max but runs
any other combine function, ``_xor_combine`` included, once per element in Python: a 256-lane
sort took ~0.4 s a program. Here it is ``np.bitwise_xor.reduce``; XOR of integers is associative
and commutative, so the result is the element-by-element fold's bit for bit.

Language patching per device-function call. A launch patches ``triton.language`` (and
``triton.language.core``) for the interpreter, and so does every call of a nested
``@triton.jit`` function, though the modules are patched already: ~1.5 ms of ``inspect`` walks a
call, a third of a fused router launch (a sort alone makes dozens of such calls). The patching
depends only on which of the two modules the function's globals hold, so a call whose modules
the running launch has patched skips it; each launch starts from scratch, and a function that
brings the other module patches as before.

Installed with the FP8 rounding fix (tests/conftest.py, tests/gloo_tp2.py), on the Triton
versions whose interpreter these paths were read against (``TESTED_TRITON``); on any other they
stay off (slower tests, the same results), since they replace private interpreter functions.
"""

from collections.abc import Callable

import numpy as np

# Triton releases (major.minor) whose interpreter has the functions and call pattern above.
TESTED_TRITON = ("3.6", "3.9")


def install() -> Callable[[], None]:
    """Patch the interpreter; returns a function that restores it (a no-op where the Triton
    version is not one of ``TESTED_TRITON``)."""
    import triton
    import triton.language as tl
    from triton.runtime import interpreter

    if ".".join(triton.__version__.split(".")[:2]) not in TESTED_TRITON:
        return lambda: None

    reduce_ops, executor = interpreter.ReduceOps, interpreter.GridExecutor
    original_reduce, original_launch = reduce_ops.apply_impl, executor.__call__
    original_patch_lang = interpreter._patch_lang
    xor_combine = tl.standard._xor_combine
    patched: set = set()  # language modules the running launch has patched

    def apply_impl(self, input):
        if self.combine_fn is not xor_combine:
            return original_reduce(self, input)
        (x,) = input  # xor_sum reduces one tensor
        reduced = np.bitwise_xor.reduce(x.handle.data, axis=self.axis, keepdims=self.keep_dims)
        return self.to_tensor(reduced, x.dtype)

    def launch(self, *args, **kwargs):
        patched.clear()  # the launch's own patching always runs
        try:
            return original_launch(self, *args, **kwargs)
        finally:
            patched.clear()  # the launch has restored the modules

    def patch_lang(fn):
        langs = {m for m in fn.__globals__.values() if m is tl or m is tl.core}
        if patched and langs <= patched:
            return None  # a device-function call: its callers ignore the scope
        scope = original_patch_lang(fn)
        patched.update(langs)
        return scope

    reduce_ops.apply_impl = apply_impl
    executor.__call__ = launch
    interpreter._patch_lang = patch_lang

    def restore() -> None:
        reduce_ops.apply_impl = original_reduce
        executor.__call__ = original_launch
        interpreter._patch_lang = original_patch_lang

    return restore
