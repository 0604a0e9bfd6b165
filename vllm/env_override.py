"""Environment settings for libraries this fork uses, made once when `vllm` is imported, before
any of them read them. Each respects a value the user has already set.

- `TORCH_CUDNN_SDPA_AVOID_RECOMPILE=1`: cuDNN's fused attention (MLA's prefill of a long new
  prompt on Hopper) builds an execution plan for every new pair of sequence lengths and
  caches it by exact shape: 75-90 ms on the H200 per prompt length never seen before (once 1.4 s),
  paid by nearly every new request in serving and by most chunked-prefill steps. Torch reads this
  opt-in once, at a process's first cuDNN attention; with it the plan is keyed on the lengths
  rounded up to powers of two, for q, k, v laid out `[B, S, H, D]` (what `mla_prefill_attention`
  passes when it is on). A process that ran a cuDNN attention before importing `vllm` keeps
  torch's per-shape plans (the results are the same). Measured in docs/performance.md,
  "Twenty-eighth run".
"""

import os

CUDNN_SDPA_AVOID_RECOMPILE = "TORCH_CUDNN_SDPA_AVOID_RECOMPILE"

os.environ.setdefault(CUDNN_SDPA_AVOID_RECOMPILE, "1")


def cudnn_sdpa_avoids_recompile() -> bool:
    """Whether torch's cuDNN attention takes its per-length-class plans (the variable is "1", as
    torch's own boolean parse accepts)."""
    return os.environ.get(CUDNN_SDPA_AVOID_RECOMPILE) == "1"
