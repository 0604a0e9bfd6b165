"""Triton's cache key of every kernel launch of an engine's steps, recorded on the CPU as an H100
would key it: what tells, without a GPU, which steps would compile a kernel again.

Triton compiles a kernel once per key: its constexprs and launch options, and its specialization
of every other argument for the CUDA backend (dtypes, 16-byte pointer alignment, ints equal to 1
or divisible by 16, i32 / i64). A key first seen in a step compiles there (0.5-1.5 s of the step
on the H100). `record_launch_keys` replaces every kernel of the fork by a `KeyRecorder` and runs
each model forward twice: first on the ops' Triton paths with an H100's launch heuristics (132
SMs, sm_90 shared memory, PDL, TMA), where the recorders run nothing, so the outputs are unwritten
buffers that the forward drops; then on the torch references, whose outputs and cache updates the
step keeps. A module of its own, like counted_kernels.py: several test folders use it.
"""

import functools
import sys
from collections.abc import Iterable

import torch

try:
    # Imported by the specialization on first use; now, while the kernels' Triton mode (the
    # interpreter, conftest.py) is the environment's, as its import asserts.
    import triton.experimental.gluon  # noqa: F401
    from triton.backends.nvidia.compiler import CUDABackend
    from triton.runtime.interpreter import InterpretedFunction
    from triton.runtime.jit import JITFunction, native_specialize_impl
except ImportError:  # a Triton without the CUDA backend or its native specialization
    CUDABackend = InterpretedFunction = JITFunction = native_specialize_impl = None

H100_SMS = 132
H100_SHARED_MEMORY = 232448  # bytes a program may use on sm_90 (227 KiB, opted in)


class KeyRecorder:
    """Stands in for a Triton kernel: each launch appends (phase, name, key) to `log` and runs
    nothing. The key is ``(("options", launch options), (parameter, part), ...)`` in parameter
    order, the part of a constexpr its value's repr, of any other parameter Triton's
    specialization: ``(type, attribute)``, ``("constexpr", 1)`` for an int equal to 1."""

    def __init__(self, name: str, kernel, log: list, phase: list[str]) -> None:
        self.name, self.log, self.phase = name, log, phase
        # The parameters as Triton's JIT sees them (the kernel may be the interpreter's).
        if isinstance(kernel, JITFunction):
            self.params = kernel.params
        else:
            self.params = JITFunction(kernel.fn, **getattr(kernel, "kwargs", {})).params

    def __getitem__(self, grid):
        def record(*args, **kwargs):
            names = [p.name for p in self.params]
            # Positional arguments first, the constexprs and launch options by keyword.
            values = dict(zip(names, args, strict=False)) | kwargs
            options = tuple(sorted((k, v) for k, v in kwargs.items() if k not in names))
            key = [("options", options)]
            for p in self.params:
                v = values.get(p.name, p.default)
                if p.is_constexpr:
                    key.append((p.name, repr(v)))
                else:
                    spec = native_specialize_impl(
                        CUDABackend, v, p.is_const, not p.do_not_specialize,
                        not p.do_not_specialize_on_alignment,
                    )  # fmt: skip
                    key.append((p.name, spec))
            self.log.append((self.phase[0], self.name, tuple(key)))

        return record


def varying(keys: Iterable[tuple]) -> set[str]:
    """The parts ("options" or a parameter's name) that differ among `keys` of one kernel."""
    parts = [dict(key) for key in keys]
    return {name for name in parts[0] if len({part[name] for part in parts}) > 1}


def _argument_type(part):
    if part[0] in ("i32", "i64", "u64") or part == ("constexpr", 1):
        return "int"
    return part[0] if part[0] != "constexpr" else part


def launch_of(key: tuple) -> tuple:
    """`key` without Triton's specialization of the arguments: its constexprs, launch options
    and argument types (an int is an int, whether Triton made it the constant 1, i32 or i64)."""
    return tuple(
        (name, _argument_type(part) if isinstance(part, tuple) and name != "options" else part)
        for name, part in key
    )


def _kernels() -> Iterable[tuple[object, str, object]]:
    """(module, attribute, kernel) for every Triton kernel defined in a loaded vllm module."""
    for name, module in list(sys.modules.items()):
        if name.startswith("vllm.") and module is not None:
            for attr, value in list(vars(module).items()):
                kernel_types = (JITFunction, InterpretedFunction)
                if isinstance(value, kernel_types) and value.fn.__module__ == name:
                    yield module, attr, value


def _rebind(monkeypatch, replacements: dict) -> None:
    """Replace, in every loaded vllm module, each name bound to a key of `replacements` (by
    identity: the ops import the heuristics by name)."""
    by_id = {id(old): new for old, new in replacements.items()}
    for name, module in list(sys.modules.items()):
        if (name == "vllm" or name.startswith("vllm.")) and module is not None:
            for attr, value in list(vars(module).items()):
                new = by_id.get(id(value))
                if new is not None:
                    monkeypatch.setattr(module, attr, new)


def _fresh_caches(monkeypatch) -> None:
    """Give every cached function of the loaded vllm modules an empty cache until `monkeypatch`
    undoes it: launch choices cached by an earlier test with the CPU's heuristics would be
    recorded here, and the H100's left behind for the next test."""
    fresh = {}
    for name, module in list(sys.modules.items()):
        if (name == "vllm" or name.startswith("vllm.")) and module is not None:
            for value in vars(module).values():
                if callable(getattr(value, "cache_parameters", None)) and value not in fresh:
                    cache = functools.lru_cache(**value.cache_parameters())
                    fresh[value] = cache(value.__wrapped__)
    _rebind(monkeypatch, fresh)


def record_launch_keys(monkeypatch, model, log: list, phase: list[str]) -> None:
    """Record the key of every kernel launch of `model`'s forwards and logits, and of the
    sampler's argmax, into `log` under `phase[0]` (see the module docstring)."""
    import vllm.model_executor.layers.fused_moe.experts as experts
    import vllm.models.kimi_k3.amd.kda as kda_layer
    import vllm.models.kimi_k3.amd.mla as mla_layer
    import vllm.triton_utils as triton_utils
    import vllm.triton_utils.pdl as pdl
    import vllm.v1.sample.sampler as sampler
    from vllm.models.kimi_k3.amd.ops.mla_prefill import mla_prefill_attention

    _fresh_caches(monkeypatch)
    for module, attr, kernel in _kernels():
        monkeypatch.setattr(module, attr, KeyRecorder(kernel.fn.__name__, kernel, log, phase))
    triton_path = {"on": False}
    _rebind(
        monkeypatch,
        {
            triton_utils.use_triton: lambda device: triton_path["on"],
            triton_utils.num_sms: lambda device=None: H100_SMS,
            triton_utils.max_shared_memory: lambda device: H100_SHARED_MEMORY,
            triton_utils.supports_tma: lambda device: True,
            pdl.use_pdl: lambda device: True,
            # torch's CUTLASS grouped GEMM, device-only for bf16 on sm_90: it sets the grouped
            # Triton experts' row limit.
            experts.grouped_mm_is_sync_free: lambda device, dtype: (
                triton_path["on"] and dtype == torch.bfloat16
            ),
        },
    )

    def twice(fn):
        def run(*args, **kwargs):
            triton_path["on"] = True
            try:
                fn(*args, **kwargs)  # the launches, recorded
            finally:
                triton_path["on"] = False
            return fn(*args, **kwargs)  # the references: the step's outputs and cache updates

        return run

    monkeypatch.setattr(model, "forward", twice(model.forward))
    monkeypatch.setattr(model, "compute_logits", twice(model.compute_logits))
    monkeypatch.setattr(sampler, "argmax", twice(sampler.argmax))

    # Where a layer branches on the device itself, its GPU op on the Triton path: the MLA
    # prefill's fused attention (its key kernel, then torch's attention on the CPU) ...
    attend_ref = mla_layer.mla_prefill_attention_ref

    def attend(q, k_nope, k_pe, v, scale, masked):
        if triton_path["on"]:
            return mla_prefill_attention(q, k_nope, k_pe, v, scale)
        return attend_ref(q, k_nope, k_pe, v, scale, masked)

    monkeypatch.setattr(mla_layer, "mla_prefill_attention_ref", attend)
    # ... and the KDA prefill core, fla-core's kernels on the GPU (not the fork's: no key to
    # record), whose CPU reference would update the states from unwritten inputs.
    kda_prefill = kda_layer.kda_prefill

    def prefill(q, k, v, *args, **kwargs):
        if triton_path["on"]:
            return torch.empty_like(v)
        return kda_prefill(q, k, v, *args, **kwargs)

    monkeypatch.setattr(kda_layer, "kda_prefill", prefill)
