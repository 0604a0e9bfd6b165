"""Compile recorded Triton launches for sm_90 (Hopper) without a GPU: the child process of
tests/triton_utils/test_kernels_compile_for_hopper.py.

It runs without ``TRITON_INTERPRET`` (the interpreter replaces ``triton.language`` in the process
that uses it, and ``@triton.jit`` then gives interpreted functions Triton cannot compile), reads
launches as JSON on stdin and writes one result per launch as JSON on stdout. A launch is
``{"module", "kernel", "args": {name: value}, "options": {...}}`` where a tensor argument is
``{"tensor": torch dtype name, "aligned": data_ptr % 16 == 0}`` and a TMA descriptor
``{"tensordesc": torch dtype name, "block": block shape}``; the signature, constexprs and
divisibility hints are derived from the values as Triton's launcher does for the CUDA backend
(a bool is ``u1``, an int equal to 1 becomes the constant 1, a multiple of 16 or a 16-byte
aligned pointer gets ``tt.divisibility`` 16, None becomes a constexpr None).
"""

import importlib
import json
import re
import sys
from collections import Counter

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

HOPPER = GPUTarget("cuda", 90, 32)
H200_SHARED_MEMORY = 232448  # bytes a program may use (227 KiB, opted in)
_I32_MIN, _I32_MAX, _I64_MAX = -(2**31), 2**31 - 1, 2**63 - 1
_DIVISIBLE = [["tt.divisibility", 16]]

# torch dtype name -> Triton's pointee type name
_TRITON_TYPES = {
    "bfloat16": "bf16", "float16": "fp16", "float32": "fp32", "float64": "fp64",
    "float8_e4m3fn": "fp8e4nv", "float8_e4m3fnuz": "fp8e4b8", "float8_e5m2": "fp8e5",
    "float8_e5m2fnuz": "fp8e5b16", "int64": "i64", "int32": "i32", "int16": "i16",
    "int8": "i8", "uint8": "u8", "bool": "u1",
}  # fmt: skip


def _int_type(value: int) -> str:
    if _I32_MIN <= value <= _I32_MAX:
        return "i32"
    return "i64" if value <= _I64_MAX else "u64"


def specialize(kernel, args: dict, opt_outs: bool = True) -> tuple[dict, dict, dict]:
    """``(signature, constexprs, attrs)`` of ``kernel`` launched with the recorded ``args``;
    without ``opt_outs``, as if it specialized every parameter (see `_opt_out_error`)."""
    signature, constexprs, attrs = {}, {}, {}
    for param in kernel.params:
        name, value = param.name, args[param.name]
        if not opt_outs:
            param = _Specialized(param)
        if param.is_constexpr or value is None:
            signature[name], constexprs[name] = "constexpr", value
        elif isinstance(value, dict) and "tensordesc" in value:
            block = ", ".join(str(b) for b in value["block"])
            signature[name] = f"tensordesc<{_TRITON_TYPES[value['tensordesc']]}[{block}]>"
        elif isinstance(value, dict):
            signature[name] = "*" + _TRITON_TYPES[value["tensor"]]
            if value["aligned"] and not param.do_not_specialize_on_alignment:
                attrs[(param.num,)] = _DIVISIBLE
        elif isinstance(value, bool):
            signature[name] = "u1"
        elif isinstance(value, int):
            if value == 1 and not param.do_not_specialize:
                signature[name], constexprs[name] = "constexpr", 1
                continue
            signature[name] = param.annotation_type or _int_type(value)
            if value % 16 == 0 and not param.do_not_specialize:
                attrs[(param.num,)] = _DIVISIBLE
        elif isinstance(value, float):
            signature[name] = param.annotation_type or "fp32"
        else:
            raise TypeError(f"{name}: no Triton type for a {type(value).__name__} argument")
    return signature, constexprs, attrs


class _Specialized:
    """A kernel parameter as if its kernel did not opt it out of Triton's specialization."""

    do_not_specialize = do_not_specialize_on_alignment = False

    def __init__(self, param) -> None:
        self._param = param

    def __getattr__(self, attr):
        return getattr(self._param, attr)


def _global_memory(ptx: str) -> Counter:
    """The PTX's global loads and stores, by instruction (its width and vector length)."""
    return Counter(re.findall(r"\b(?:ld|st)\.global[\w.:]*", ptx))


def _opt_out_error(launch: dict, ptx: str) -> str | None:
    """Why the kernel's opt-outs of Triton's specialization (``do_not_specialize``,
    ``do_not_specialize_on_alignment``) change its global loads and stores, against the launch
    with those parameters specialized at their best (ints multiples of 16, 16-byte aligned
    pointers): an opt-out that took a vector access away would cost bandwidth, which no result
    shows (None if they change nothing, the kernel has none, or the launch says
    ``opt_outs_may_narrow``)."""
    kernel = getattr(importlib.import_module(launch["module"]), launch["kernel"])
    opted = [p for p in kernel.params if p.do_not_specialize or p.do_not_specialize_on_alignment]
    if not opted or launch.get("opt_outs_may_narrow"):
        return None
    args = dict(launch["args"])
    for param in opted:
        value = args[param.name]
        if isinstance(value, dict) and "tensor" in value:
            args[param.name] = dict(value, aligned=True)
        elif isinstance(value, int) and not isinstance(value, bool):
            args[param.name] = value + -value % 16  # a multiple of 16 of the same int type
    specialized = _global_memory(_compile(dict(launch, args=args), opt_outs=False).asm["ptx"])
    if specialized != _global_memory(ptx):
        return (
            f"the opt-outs of {[p.name for p in opted]} change the global accesses: "
            f"{dict(_global_memory(ptx))} against {dict(specialized)} specialized"
        )
    return None


def _order_error(
    ptx: str, first: str, second: str, later: list[str], not_before_first: list[str]
) -> str | None:
    """Why the PTX does not hold ``first`` before ``second`` before every string of ``later``,
    with no string of ``not_before_first`` before ``first`` (None if it does)."""
    i, j = ptx.find(first), ptx.find(second)
    if i < 0 or j < 0 or j < i:
        return f"PTX lacks {first!r} before {second!r}"
    early = [s for s in later if 0 <= ptx.find(s) < j]
    early += [s for s in not_before_first if 0 <= ptx.find(s) < i]
    if early:
        return f"PTX has {early} before {second!r} / {first!r}"
    return None


def _barrier_error(ptx: str, waits: list[str], upto: str) -> str | None:
    """Why a global load before the first ``upto`` (the end if it is absent) comes after the
    first match of the patterns ``waits`` (None if none does), or why the check does not apply
    (no match before ``upto``): a load after a ``bar.sync`` waits for every warp to reach it, one
    after a branch on a loaded value (``bra``) for that load."""
    end = ptx.find(upto) if upto and upto in ptx else len(ptx)
    found = [m.start() for m in (re.compile(w).search(ptx, 0, end) for w in waits) if m]
    if not found:
        return f"PTX has none of {waits} before {upto or 'its end'!r}: nothing to check"
    if ptx.find("ld.global", min(found), end) >= 0:
        return f"PTX has an ld.global after one of {waits} before {upto or 'its end'!r}"
    return None


def _store_error(ptx: str, first: str) -> str | None:
    """Why the first ``st.global`` does not come after the first ``first`` (None if it does)."""
    i, j = ptx.find(first), ptx.find("st.global")
    if i < 0 or 0 <= j < i:
        return f"PTX has an st.global before any {first!r}"
    return None


def reduce_layouts(launch: dict) -> list[str]:
    """The layouts, spelled out, of the ``tt.reduce`` operands of shape ``launch["reduce_shape"]``
    (``"128x16"``) in the launch's sm_90 TTGIR, in program order."""
    ir = _compile(launch).asm["ttgir"]
    aliases = dict(re.findall(r"^(#\w+) = (#ttg\.\w+<\{.*\}>)$", ir, re.M))
    operand = f"}}) : (tensor<{launch['reduce_shape']}xf32, "
    layouts = []
    for op in ir.split('"tt.reduce"(')[1:]:
        # the op's signature follows its combine region's end, the op's first "}) : ("
        start = op.find("}) : (")
        if op.startswith(operand, start):
            alias = re.match(r"#\w+", op[start + len(operand) :]).group()
            layouts.append(aliases[alias])
    return layouts


def _compile(launch: dict, opt_outs: bool = True):
    kernel = getattr(importlib.import_module(launch["module"]), launch["kernel"])
    signature, constexprs, attrs = specialize(kernel, launch["args"], opt_outs)
    source = ASTSource(kernel, signature, constexprs, attrs)
    return triton.compile(source, target=HOPPER, options=launch["options"])


def compile_launch(launch: dict) -> str | None:
    """None if the launch compiles for sm_90, fits an H200's shared memory and its PTX holds
    every string of ``launch["ptx_has"]`` and none of ``launch["ptx_lacks"]`` (optional lists),
    and, given ``launch["ptx_order"]`` = ``[first, second, later, not_before_first]``, ``first``
    before ``second`` before any string of the list ``later``, and no string of
    ``not_before_first`` before ``first``, and, given ``launch["loads_before_barrier"]`` =
    ``[waits, upto]`` (``upto`` "" for the end), a match of ``waits`` before ``upto`` and no
    global load after the first of them up to ``upto``, and, given ``launch["stores_after"]``,
    no ``st.global`` before its first occurrence, and, given ``launch["loads_around"]`` =
    ``[mark, before]``, exactly ``before`` ``ld.global`` s ahead of the first ``mark`` and one or
    more after it, and the kernel's opt-outs of Triton's specialization change none of its global
    loads and stores (`_opt_out_error`); else why not."""
    try:
        compiled = _compile(launch)
    except Exception as e:  # the test reports any failure
        return f"{type(e).__name__}: {e}"
    shared = compiled.metadata.shared
    if shared > H200_SHARED_MEMORY:
        return f"needs {shared} bytes of shared memory, an H200 program has {H200_SHARED_MEMORY}"
    ptx = compiled.asm["ptx"]
    missing = [s for s in launch.get("ptx_has", ()) if s not in ptx]
    present = [s for s in launch.get("ptx_lacks", ()) if s in ptx]
    if missing or present:
        return f"PTX lacks {missing} / holds {present}"
    if "ptx_order" in launch:
        error = _order_error(ptx, *launch["ptx_order"])
        if error:
            return error
    if "stores_after" in launch:
        error = _store_error(ptx, launch["stores_after"])
        if error:
            return error
    if "loads_around" in launch:
        mark, before = launch["loads_around"]
        at = ptx.find(mark)
        early = ptx.count("ld.global", 0, at) if at >= 0 else -1
        if early != before or ptx.find("ld.global", at) < 0:
            return f"PTX has {early} ld.global before {mark!r}, not {before}, or none after it"
    if "loads_before_barrier" in launch:
        error = _barrier_error(ptx, *launch["loads_before_barrier"])
        if error:
            return error
    return _opt_out_error(launch, ptx)


def main() -> None:
    launches = json.load(sys.stdin)
    check = reduce_layouts if sys.argv[1:] == ["--reduce-layouts"] else compile_launch
    json.dump([check(launch) for launch in launches], sys.stdout)


if __name__ == "__main__":
    main()
