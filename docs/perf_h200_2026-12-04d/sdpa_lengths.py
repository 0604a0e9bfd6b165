"""Device-call probe, prepared in the twenty-seventh run for the next: what a prompt length the
process has not seen costs in MLA's prefill attention. `mla_prefill_attention` calls torch's
`scaled_dot_product_attention(is_causal=True)` on [1, H, L, 192] bf16 views of [L, H, 192] rows;
on the H200 torch picks cuDNN, which builds an execution plan per new shape (tens to hundreds of
ms elsewhere), unless `TORCH_CUDNN_SDPA_AVOID_RECOMPILE=1` (the ragged path) or the length rules
cuDNN out. In serving, chunked prefill gives most steps new lengths.

For each mode (argv: default | avoid_recompile | flash), lengths in three groups: multiples of
128, others near 8192, others near 1024. Per length the first call's and the second call's
wall time (synchronized) and the attention kernel's name.

    python sdpa_lengths.py default
"""

import os
import sys
import time

MODE = sys.argv[1] if len(sys.argv) > 1 else "default"
if MODE == "avoid_recompile":
    os.environ["TORCH_CUDNN_SDPA_AVOID_RECOMPILE"] = "1"

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch.profiler import ProfilerActivity, profile  # noqa: E402

HEADS, DIM = 32, 192
LENGTHS = [8192, 7936, 7808, 8191, 8190, 8150, 8129, 1024, 1000, 1001, 1023, 640, 641]


def attend(rows: torch.Tensor) -> torch.Tensor:
    q = rows.transpose(0, 1).unsqueeze(0)
    return F.scaled_dot_product_attention(q, q, q, is_causal=True, scale=DIM**-0.5)


def timed(rows: torch.Tensor) -> float:
    torch.cuda.synchronize()
    start = time.perf_counter()
    attend(rows)
    torch.cuda.synchronize()
    return (time.perf_counter() - start) * 1e3


def main() -> None:
    if MODE == "flash":
        torch.backends.cuda.enable_cudnn_sdp(False)
    print(f"mode {MODE}, torch {torch.__version__}, cuDNN {torch.backends.cudnn.version()}")
    warm = torch.randn(256, HEADS, DIM, device="cuda", dtype=torch.bfloat16)
    timed(warm)
    timed(warm)
    for length in LENGTHS:
        rows = torch.randn(length, HEADS, DIM, device="cuda", dtype=torch.bfloat16)
        first, second = timed(rows), timed(rows)
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            attend(rows)
            torch.cuda.synchronize()
        names = [e.name for e in prof.events() if e.device_type.name == "CUDA"]
        kernel = max(names, key=len, default="?")[:70]
        print(
            f"L={length:5d}  first {first:8.2f} ms  second {second:7.2f} ms  {kernel}", flush=True
        )


if __name__ == "__main__":
    main()
