"""Programmatic dependent launch (PDL) for the fork's Triton kernels on NVIDIA GPUs from Hopper on.

A decode step at small batch is a chain of a few hundred short kernels in one CUDA graph; each
one's launch, the scheduling of its programs and their first loads wait for the kernel before it
to drain completely. Launched with PDL (``launch_pdl=True``: the launch attribute
``CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION``, which a CUDA graph captures as a
programmatic edge), a kernel may start once every program of the kernel before it has signalled
(``griddepcontrol.launch_dependents``) or exited, and it must then wait
(``griddepcontrol.wait``: until that kernel has completed and its memory is visible) before it
touches memory that kernel, or any earlier one, may write or still read (a buffer the caching
allocator hands out again is both).

The contract every kernel here keeps, through ``pdl_wait`` before its first access to memory
other than a static weight's load:

* Each program waits before its first load or store of any tensor (but the static weights
  below), and before it could exit, so
  a kernel completes only after the kernel before it did. Hence, by induction along the stream,
  when a kernel's wait returns every kernel before it has completed, whether or not they were
  launched with PDL (a plain launch waits for completion anyway).
* Each program signals only after its wait returns, so the next kernel's programs are scheduled
  no earlier than the kernel before this one has completed and every program of this one has
  started (the last wave's, in a grid of several): at most two kernels overlap. The next
  kernel's programs fill the SMs this kernel's tail leaves idle, and its launch latency overlaps
  this one's run. Signalling before the wait instead (kernels launched two deep, the wait's
  guarantee unchanged) measured 11-15 us a batch-1 step slower on an H100 (docs/performance.md,
  "Fifty-third run").
* Nothing is read before the wait but a weight its launcher declares static. By the bullet
  above only the kernel just before can still be running when such a load issues, and only the
  wait makes that kernel's writes visible: a static weight is memory that kernel does not write
  (a layer's parameters, written once at load, qualify). The FP8 and batched GEMVs and the
  one-token router load such weights before the wait (``static_weight``:
  vllm/model_executor/kernels/linear/gemv.py, fused_router.py), which streams them in while the
  kernel before still runs; everything else gains only the launch and scheduling latency between
  kernels, with no ordering argument per kernel to get wrong.

``pdl_options(use_pdl(device))`` is what a launcher adds to a kernel's constexprs and options:
``PDL=True, launch_pdl=True`` where PDL runs, ``PDL=False`` elsewhere (ROCm, GPUs before sm_90,
the CPU interpreter, which cannot run the instructions, or ``VLLM_TRITON_PDL=0``). A kernel not
launched with PDL after one that is waits for it in full, as usual, so kernels without PDL
(cuBLAS, fla-core, torch) may sit anywhere in the chain.
"""

from collections.abc import Mapping
from functools import cache
from types import MappingProxyType

import torch

import vllm.envs as envs
from vllm.platforms import current_platform
from vllm.triton_utils import _capability

try:
    import triton
    import triton.language as tl
except ImportError:  # CPU-only installs without Triton launch no kernel
    triton = None
try:
    from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait
except ImportError:  # a Triton without grid dependency control: no PDL (pdl_wait does nothing)
    gdc_launch_dependents = gdc_wait = None

__all__ = ["pdl_options", "pdl_wait", "use_pdl"]


def use_pdl(device: torch.device) -> bool:
    """Whether kernels launched on ``device`` take programmatic dependent launch (module
    docstring). ``VLLM_TRITON_PDL`` is read once per process."""
    if device.type != "cuda":
        return False
    return _use_pdl(device.index if device.index is not None else torch.cuda.current_device())


@cache
def _use_pdl(index: int) -> bool:
    if gdc_wait is None or not current_platform.is_cuda() or not envs.VLLM_TRITON_PDL:
        return False
    return _capability(index)[0] >= 9


_ON = MappingProxyType({"PDL": True, "launch_pdl": True})
_OFF = MappingProxyType({"PDL": False})


def pdl_options(pdl: bool) -> Mapping[str, bool]:
    """The launch arguments of a kernel that calls ``pdl_wait(PDL)`` first: the ``PDL``
    constexpr, and with ``pdl`` (``use_pdl`` of the launch's device) the ``launch_pdl`` option
    (read-only mappings, to unpack)."""
    return _ON if pdl else _OFF


if triton is not None:

    @triton.jit
    def pdl_wait(PDL: tl.constexpr):
        """Before a kernel's first access to memory other than a static weight's load: with
        ``PDL``, wait for the kernels before it, then let the next one launch (module
        docstring). Nothing without."""
        if PDL:
            gdc_wait()
            gdc_launch_dependents()
