"""Torch's fused attention backends at the MLA prefill's shapes: which one, and with the value
operand padded to the query/key head dim or not.

`mla_prefill_attention` (vllm/models/kimi_k3/amd/ops/mla_prefill.py) gives torch one head dim
for q, k and v by widening the value operand to `nope + rope` (a view, no copy); with the
`causal_lower_right` mask torch runs cuDNN's fused attention on the H200. This times one
sequence of --tokens (a new prompt: the causal mask is the square one), Kimi-Linear's 32 heads,
q/k head dim 192 and value head dim 128, bf16, through each backend with v padded to 192 and at
its own 128 where the backend takes that. TFLOP/s count the useful FLOPs (the causal half of
QK^T at 192 and PV at 128); every output's first 128 columns are compared with the first case's,
and the script fails (exit 1) where they differ by more than `TOLERANCE` (a few bf16 roundings of
the O(1) outputs).

    python benchmarks/kernels/benchmark_mla_prefill_sdpa.py
    python benchmarks/kernels/benchmark_mla_prefill_sdpa.py --tokens 2048 8192
"""

import argparse
import sys

import torch
import torch.nn.functional as F
from kernel_bench import require_gpu
from torch.nn.attention import SDPBackend, sdpa_kernel

from vllm.utils.cli import run_main

HEADS, QK_DIM, V_DIM = 32, 192, 128
TOLERANCE = 2**-5

# (name, backend, value head dim, mask form)
CASES = [
    ("flash, v padded, lower-right mask", SDPBackend.FLASH_ATTENTION, QK_DIM, "lower_right"),
    ("flash, v padded, is_causal", SDPBackend.FLASH_ATTENTION, QK_DIM, "is_causal"),
    ("efficient, v 128, lower-right mask", SDPBackend.EFFICIENT_ATTENTION, V_DIM, "lower_right"),
    ("cudnn, v padded, lower-right mask", SDPBackend.CUDNN_ATTENTION, QK_DIM, "lower_right"),
    ("cudnn, v padded, is_causal", SDPBackend.CUDNN_ATTENTION, QK_DIM, "is_causal"),
    ("cudnn, v 128, is_causal", SDPBackend.CUDNN_ATTENTION, V_DIM, "is_causal"),
]


def time_us(fn, reps: int) -> float:
    """Microseconds per call: CUDA events around `reps` back-to-back calls after a warm-up."""
    for _ in range(3):
        fn()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(reps):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / reps * 1e3


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--tokens", type=int, nargs="+", default=[8192], help="prompt lengths")
    parser.add_argument("--reps", type=int, default=10, help="calls per timing")
    args = parser.parse_args(argv)
    require_gpu(parser, dry_run=False)
    if args.reps < 1 or min(args.tokens) < 1:
        parser.error("--tokens and --reps must be >= 1")
    from torch.nn.attention.bias import causal_lower_right

    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}")
    gen = torch.Generator(device="cuda").manual_seed(0)
    worst = 0.0
    for tokens in args.tokens:
        shape = (1, HEADS, tokens)
        q = torch.randn(*shape, QK_DIM, device="cuda", dtype=torch.bfloat16, generator=gen)
        k = torch.randn(*shape, QK_DIM, device="cuda", dtype=torch.bfloat16, generator=gen)
        v = torch.randn(*shape, V_DIM, device="cuda", dtype=torch.bfloat16, generator=gen)
        padded = F.pad(v, (0, QK_DIM - V_DIM))
        flops = 2 * HEADS * tokens * (tokens + 1) / 2 * (QK_DIM + V_DIM)
        first = None
        for name, backend, v_dim, mask in CASES:
            value = v if v_dim == V_DIM else padded
            kwargs = (
                {"attn_mask": causal_lower_right(tokens, tokens)}
                if mask == "lower_right"
                else {"is_causal": True}
            )

            def call(q=q, k=k, value=value, kwargs=kwargs):
                return F.scaled_dot_product_attention(q, k, value, scale=QK_DIM**-0.5, **kwargs)

            try:
                with sdpa_kernel([backend]):
                    out = call()[..., :V_DIM].float()
                    us = time_us(call, args.reps)
            except RuntimeError as exc:
                print(f"T={tokens:>5} {name:>36}: not taken ({str(exc).splitlines()[0][:100]})")
                continue
            first = out if first is None else first
            diff = (out - first).abs().max().item()
            worst = max(worst, diff)
            print(f"T={tokens:>5} {name:>36}: {us:9.1f} us  {flops / us / 1e6:6.1f} TFLOP/s  "
                  f"max |diff| {diff:.3g}")  # fmt: skip
    if worst > TOLERANCE:
        print(f"outputs differ by up to {worst:.3g} (> {TOLERANCE})", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(run_main(main))
