"""vllm-k3: a vLLM-style engine for Kimi-K3 / Kimi-Linear with PTPC FP8 linears.

`from vllm import LLM, SamplingParams` as upstream; both are imported on first use so that
`import vllm` stays light (the kernels and tools import submodules directly).
"""

from typing import Any

from vllm import env_override  # noqa: F401  (first: before any library reads its settings)

__version__ = "0.1.0"

_LAZY = {
    "LLM": "vllm.entrypoints.llm",
    "SamplingParams": "vllm.sampling_params",
    "RequestOutput": "vllm.outputs",
    "CompletionOutput": "vllm.outputs",
    "EngineArgs": "vllm.engine.arg_utils",
    "TextPrompt": "vllm.inputs",
    "TokensPrompt": "vllm.inputs",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'vllm' has no attribute {name!r}")


__all__ = [*_LAZY, "__version__"]
