"""Benchmark MLA paged decode (absorbed form): the fork's split-KV Triton kernel against the torch
reference, at Kimi-Linear sizes (32 heads, latent 512, rope 64, bf16 cache).

Every sequence of a batch holds the full context; its blocks are scattered through the pool. Both
providers are timed as CUDA-graph replay (what a decode step pays). Reported per case:

  kernel_us  `mla_decode_paged` (split kernel + merge when it splits), microseconds per call
  GB/s       cache bytes read, N * ctx * (L + R) * 2 B, per second (queries and output are < 1%)
  %copy      GB/s over the device's copy bandwidth, measured in the same run: an eager `copy_` of
             --copy-gib GiB after warm-up, counting bytes read + written
  ref_us     `mla_decode_paged_ref` (gathers the whole context in fp32), where it fits in
             --ref-max-gib of scratch memory; `speedup` = ref_us / kernel_us

    python benchmarks/kernels/benchmark_mla_decode.py --csv mla_decode.csv

`--dry-run` runs one tiny case once, checked against the reference and untimed; without a GPU
run it under the Triton interpreter: TRITON_INTERPRET=1 python ... --dry-run
"""

import argparse
import sys

import torch

from vllm.models.kimi_k3.amd.ops import mla_decode as op_module
from vllm.models.kimi_k3.amd.ops.mla_decode import (
    mla_decode_config,
    mla_decode_paged,
    mla_decode_paged_ref,
)

HEADS, LATENT, ROPE = 32, 512, 64
BATCHES = [1, 8, 64]
CONTEXTS = [1024, 8192, 32768]


def make_case(batch: int, ctx: int, block_size: int, device: str, dtype: torch.dtype, seed: int):
    gen = torch.Generator(device=device).manual_seed(seed)
    max_blocks = -(-ctx // block_size)
    num_blocks = batch * max_blocks
    q = torch.randn(batch, HEADS, LATENT + ROPE, generator=gen, device=device, dtype=dtype)
    cache = torch.randn(
        num_blocks, block_size, LATENT + ROPE, generator=gen, device=device, dtype=dtype
    )
    tables = torch.randperm(num_blocks, generator=gen, device=device).view(batch, max_blocks)
    return dict(
        q_latent=q[..., :LATENT],
        q_pe=q[..., LATENT:],
        kv_cache=cache,
        block_tables=tables.to(torch.int32),
        seq_lens=torch.full((batch,), ctx, dtype=torch.int32, device=device),
        scale=192**-0.5,
    )


def copy_gbps(gib: float) -> float:
    """Device copy bandwidth (GB/s, read + write) of an eager `copy_`, after warm-up."""
    src = torch.empty(int(gib * 2**30), dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    for _ in range(3):
        dst.copy_(src)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    reps = 10
    start.record()
    for _ in range(reps):
        dst.copy_(src)
    end.record()
    end.synchronize()
    seconds = start.elapsed_time(end) / 1e3 / reps
    return 2 * src.numel() / seconds / 1e9


def ref_scratch_bytes(batch: int, ctx: int) -> int:
    # The reference's fp32 gather of every table entry, its 16-bit source, scores and probabilities.
    return batch * ctx * (LATENT + ROPE) * (4 + 2) + 2 * batch * HEADS * ctx * 4


def dry_run(block_size: int) -> int:
    device = "cuda" if torch.cuda.is_available() else "cpu"
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    case = make_case(2, 3 * block_size + 1, block_size, device, dtype, seed=0)
    got = mla_decode_paged(**case)
    ref = mla_decode_paged_ref(**case)
    err = (got.float() - ref.float()).abs().max().item()
    path = "Triton" if op_module._use_triton(torch.device(device)) else "the torch reference"
    print(
        f"dry run on {device} via {path}: batch 2, ctx {3 * block_size + 1}, max |diff| {err:.2e}"
    )
    return 0 if err < 2**-7 else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--batches", type=int, nargs="+", default=BATCHES, help="batch sizes")
    parser.add_argument(
        "--contexts", type=int, nargs="+", default=CONTEXTS, help="tokens per sequence"
    )
    parser.add_argument("--block-size", type=int, default=64, help="tokens per cache block")
    parser.add_argument("--graph-calls", type=int, default=20, help="calls per captured graph")
    parser.add_argument("--copy-gib", type=float, default=2.0, help="size of the copy (>= 1)")
    parser.add_argument(
        "--ref-max-gib", type=float, default=24.0, help="skip the reference above this scratch"
    )
    parser.add_argument("--csv", help="write the results to this CSV file")
    parser.add_argument(
        "--dry-run", action="store_true", help="one tiny checked case, untimed (works on CPU)"
    )
    args = parser.parse_args(argv)
    if args.dry_run:
        return dry_run(args.block_size)
    if not torch.cuda.is_available():
        parser.error("this benchmark needs a CUDA or ROCm GPU (or --dry-run)")
    if args.copy_gib < 1:
        parser.error("--copy-gib must be >= 1 so the copy is not served from L2")

    # Imported here: that module needs Triton, which --dry-run on a bare CPU may lack.
    from benchmark_rmsnorm_gated_fp8_per_token import time_graph, write_csv

    sms = torch.cuda.get_device_properties(0).multi_processor_count
    copy = copy_gbps(args.copy_gib)
    print(f"{torch.cuda.get_device_name(0)}: copy {copy:.0f} GB/s (read + write), {sms} SMs")
    rows = []
    with torch.inference_mode():
        for ctx in args.contexts:
            for batch in args.batches:
                case = make_case(batch, ctx, args.block_size, "cuda", torch.bfloat16, seed=batch)
                capacity = case["block_tables"].shape[1] * args.block_size
                splits = mla_decode_config(batch, HEADS, LATENT, capacity, sms).num_splits
                cache_bytes = batch * ctx * (LATENT + ROPE) * 2
                kernel_us = time_graph(lambda c=case: mla_decode_paged(**c), args.graph_calls)
                gbps = cache_bytes / kernel_us / 1e3
                row = dict(
                    batch=batch, ctx=ctx, block_size=args.block_size, splits=splits,
                    cache_mib=round(cache_bytes / 2**20, 1), kernel_us=round(kernel_us, 2),
                    gbps=round(gbps, 1), pct_copy=round(100 * gbps / copy, 1),
                    copy_gbps=round(copy, 1), ref_us=None, speedup=None,
                )  # fmt: skip
                if ref_scratch_bytes(batch, ctx) <= args.ref_max_gib * 2**30:
                    ref_us = time_graph(lambda c=case: mla_decode_paged_ref(**c), 2, reps=10)
                    row.update(ref_us=round(ref_us, 2), speedup=round(ref_us / kernel_us, 2))
                rows.append(row)
                write_csv(args.csv, rows)  # after every row: an interrupted run keeps its rows
                ref = "ref skipped"
                if row["ref_us"] is not None:
                    ref = f"ref {row['ref_us']:9.2f} us ({row['speedup']:6.2f}x)"
                print(
                    f"B={batch:>3} ctx={ctx:>6} splits={splits:>2} {row['cache_mib']:8.1f} MiB  "
                    f"kernel {kernel_us:8.2f} us {gbps:7.0f} GB/s {row['pct_copy']:5.1f}% copy  "
                    f"{ref}",
                    flush=True,
                )
                del case
                torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
