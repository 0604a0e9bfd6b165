"""Every `VLLM_*` environment variable the fork reads, typed and documented, in one place.

Read through this module (`vllm.envs.VLLM_LOGGING_LEVEL`), never with `os.environ` elsewhere, so
that `python -c "import vllm.envs as e; print(e.describe())"` lists them all.
"""

import logging
import os
from collections.abc import Callable
from typing import Any


class EnvVarError(ValueError):
    """A `VLLM_*` variable's value is refused; the message starts with `NAME=value`, so that a
    command line reports the variable, not one of its own arguments."""


def _log_level(value: str | None) -> str:
    """A level name `logging` knows (WARN, FATAL and NOTSET too), any case (default INFO)."""
    level = (value or "INFO").strip().upper()
    if not isinstance(logging.getLevelName(level), int):
        raise ValueError("expected a logging level: DEBUG, INFO, WARNING, ERROR or CRITICAL")
    return level


def _switch(default: bool) -> Callable[[str | None], bool]:
    """Parser of an on/off variable: 1 / true or 0 / false (any case), `default` when unset or
    empty. Anything else is an error: read as off, `=true` or `=yes` once turned a default-on
    switch off without a word."""

    def parse(value: str | None) -> bool:
        word = (value or "").strip().lower()
        if not word:
            return default
        if word in ("1", "true"):
            return True
        if word in ("0", "false"):
            return False
        raise ValueError("expected 1 or 0 (true or false)")

    return parse


# name -> (parser of the raw value or None, help text)
_VARIABLES: dict[str, tuple[Callable[[str | None], Any], str]] = {
    "VLLM_TARGET_DEVICE": (
        lambda v: (v or "").lower() or None,
        "Build target for setup.py: cuda | rocm | cpu | empty. Unset: detected from the "
        "installed torch (a GPU build of torch with its compiler present builds vllm._C).",
    ),
    "VLLM_TARGET_PLATFORM": (
        lambda v: (v or "").lower() or None,
        "Force the run-time platform (cuda | rocm | cpu) instead of detecting it from torch.",
    ),
    "VLLM_FP8_LINEAR_KERNEL": (
        lambda v: v or None,
        "Force the FP8 scaled-mm linear kernel by class name (e.g. "
        "ChannelWiseTorchFP8ScaledMMLinearKernel) instead of choosing by platform.",
    ),
    "VLLM_ROCM_USE_AITER": (
        _switch(False),
        "ROCm: use AITER kernels at all (default 0).",
    ),
    "VLLM_ROCM_USE_AITER_LINEAR": (
        _switch(True),
        "ROCm: with VLLM_ROCM_USE_AITER=1, use AITER's FP8 linear kernels (default 1).",
    ),
    "VLLM_ROCM_USE_AITER_LINEAR_HIPBMM": (
        _switch(False),
        "ROCm: allow the hipBLASLt preshuffled PTPC GEMM (aiter.hipb_mm) (default 0).",
    ),
    "VLLM_USE_BREAKABLE_CUDAGRAPH": (
        lambda v: None if v is None else v == "1",
        "Set by the ROCm serving recipe; no effect here (decode runs as whole CUDA graphs, "
        "one per batch size). `vllm serve` logs that it is ignored.",
    ),
    "VLLM_KIMI_K3_FUSED_OPROJ_EPILOGUE": (
        _switch(True),
        "KDA layers whose o_proj is PTPC FP8 run gated RMSNorm + per-token FP8 quantization as "
        "one fused op feeding o_proj (default 1). 0: o_norm, then o_proj quantizes its own "
        "normed input (the unfused baseline, for accuracy and speed comparisons).",
    ),
    "VLLM_KIMI_FUSE_SHARED_EXPERTS": (
        _switch(True),
        "Kimi MoE blocks with exactly one shared expert of the routed experts' size (no latent "
        "MoE, SiLU or SiTU, shared expert unquantized) run it as one more expert of the routed "
        "experts' kernels, weight 1.0, summed with the routed outputs in fp32 (default 1). 0: a "
        "separate shared MLP and a bf16 add (the unfused baseline, for accuracy and speed "
        "comparisons).",
    ),
    "VLLM_KDA_PREFILL_GRAPHS": (
        _switch(True),
        "On CUDA without --enforce-eager, the KDA layers' prefill core (fla-core's chunk_kda) "
        "replays CUDA graphs captured at start-up for steps of up to 2048 prefill tokens in up "
        "to 16 sequences (default 1). 0: always eager.",
    ),
    "VLLM_TRITON_PDL": (
        _switch(True),
        "NVIDIA sm_90+: launch the fork's Triton kernels with programmatic dependent launch, so "
        "that a kernel's programs start while the one before it drains (default 1; "
        "vllm/triton_utils/pdl.py). 0: plain stream order (the baseline, for speed comparisons).",
    ),
    "VLLM_API_KEY": (
        lambda v: v or None,
        "`vllm serve`: the API key when --api-key is not given.",
    ),
    "VLLM_LOGGING_LEVEL": (
        _log_level,
        "Level of the `vllm` loggers (default INFO).",
    ),
}


# Read where a bad value is reported and the default used instead: the logging level, read at
# the first import of the package, before any command could report it (vllm/logger.py).
_LENIENT = frozenset({"VLLM_LOGGING_LEVEL"})


def refused() -> list[EnvVarError]:
    """An EnvVarError for each variable whose value is refused (but `_LENIENT`'s). The engine
    checks them all before it builds anything, so a bad one fails start-up, not the code path
    that first reads it (a forward pass: a served engine's first request)."""
    errors = []
    for name in _VARIABLES:
        if name not in _LENIENT:
            try:
                __getattr__(name)
            except EnvVarError as e:
                errors.append(e)
    return errors


def describe() -> str:
    """One line per variable: name, current value (or the bad one, marked), help."""
    lines = []
    for name, (_, help_text) in _VARIABLES.items():
        try:
            value = repr(__getattr__(name))
        except ValueError:
            value = f"<invalid: {os.environ.get(name)!r}>"
        lines.append(f"{name}={value}: {help_text}")
    return "\n".join(lines)


def __getattr__(name: str) -> Any:
    if name in _VARIABLES:
        raw = os.environ.get(name)
        try:
            return _VARIABLES[name][0](raw)
        except ValueError as e:
            raise EnvVarError(f"{name}={raw!r}: {e}") from None
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return [*_VARIABLES, "describe", "refused"]
