"""Probe-only workarounds for running fla-core under TRITON_INTERPRET=1 on a CPU: the interpreter
has no driver, so the autotuner cannot benchmark; keep one config (the first that survives
pruning) so that no benchmark runs."""

import triton.runtime.autotuner as _at

_orig_prune = _at.Autotuner.prune_configs


def _prune_first(self, kwargs):
    # PROBE_AUTOTUNE=last keeps the last surviving config instead (another tiling).
    import os

    configs = _orig_prune(self, kwargs)
    return configs[-1:] if os.environ.get("PROBE_AUTOTUNE") == "last" else configs[:1]


_at.Autotuner.prune_configs = _prune_first


# fla's kernels call `.to(tl.int64)` on the induction variable of a plain Python `range` loop,
# which compiled Triton makes a tensor and the interpreter leaves a Python int. In the modules
# that do so (kernels only: their host code has no `range`), loops yield ints with a `.to`.
class _IndexInt(int):
    def to(self, *args, **kwargs):
        return int(self)


def _range(*args):
    for i in range(*args):
        yield _IndexInt(i)


def patch_range(*module_names):
    import importlib

    for name in module_names:
        importlib.import_module(name).__dict__["range"] = _range


patch_range("fla.ops.common.chunk_delta_h")

# The project's fix of the interpreter's bf16 handling (fp32 -> bf16 truncation, bf16 tl.dot
# operands multiplied as raw uint16 patterns), as the test session installs it.
from vllm.triton_utils import interpreter_rounding  # noqa: E402

interpreter_rounding.install()
