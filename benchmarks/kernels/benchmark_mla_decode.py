"""Benchmark MLA paged decode (absorbed form): a sweep of the split-KV Triton kernel's launch
configurations at Kimi-Linear sizes (32 heads, latent 512, rope 64, bf16 cache), against the
default choice of `mla_decode_config`.

Every sequence of a batch holds the full context; its blocks are scattered through the pool. Each
launch is timed as CUDA-graph replay (what a decode step pays), every call of a replay reading its
own copy of the cache, so that the cache is read from HBM and not from L2 (the copies of one replay
add up to >= 256 MiB). Per (batch, context):

  config     h{block_h}n{block_n}w{num_warps}s{num_stages}l{split_l} p{programs/SM} x{num_splits}
  us         `launch_mla_decode` (split kernel + merge when it splits), microseconds per call
  %copy      cache bytes read (N * ctx * (L + R) * 2 B) per second over the device's copy
             bandwidth, measured in the same run: an eager `copy_` of --copy-gib GiB after
             warm-up, counting bytes read + written

Printed per case: the heuristic's config, the best config and, for every kernel config, its best
split count. Split counts swept: `mla_num_splits` for 1, 2 and 4 programs per SM (the rule the op
applies to a tuned entry), and the heuristic's. At the end: the best config per case, as lines of
`_TUNED` in vllm/models/kimi_k3/amd/ops/mla_decode.py (the default launch per (batch, context)
bucket). `--configs` restricts the sweep to the kernel configs named (`h32n64w8s5l1 ...`); `--csv`
writes every measurement (one row per config and split count); `--ref` also times the torch
reference (gathers the whole context in fp32) where it fits in --ref-max-gib of scratch memory.
A kernel config the device cannot run (shared memory) is reported and skipped.

    python benchmarks/kernels/benchmark_mla_decode.py --csv mla_decode.csv

`--dry-run` runs one tiny case once per config kind (one split, several, two head blocks),
checked against the reference and untimed; without a GPU run it under the Triton interpreter:
TRITON_INTERPRET=1 python ... --dry-run
"""

import argparse
import itertools
import sys

import torch

from vllm.models.kimi_k3.amd.ops.mla_decode import (
    MLA_KERNEL_CHOICES,
    MlaDecodeConfig,
    launch_mla_decode,
    mla_decode_config,
    mla_decode_paged,
    mla_decode_paged_ref,
    mla_num_splits,
)
from vllm.triton_utils import use_triton

HEADS, LATENT, ROPE = 32, 512, 64
BATCHES = [1, 8, 64]
CONTEXTS = [8192, 32768]
# (block_h, block_n, num_warps, num_stages, split_l), with what ptxas reports on sm_90 (Triton 3.6):
# registers a thread, shared memory, programs an SM holds, and cache tiles in flight. Below 5
# stages the block-table indirection leaves the tiles single-buffered (see `mla_decode_config`).
#   h32n32w8s2l1  128 regs,  74 KiB, 2 per SM, single-buffered (the default before this sweep)
#   h32n16w8s2l1  128 regs,  55 KiB, 2 per SM, single-buffered
#   h32n32w8s5l1  218 regs, 111 KiB, 1 per SM, double-buffered
#   h32n32w8s7l1  228 regs, 147 KiB, 1 per SM, triple-buffered
#   h32n64w8s5l1  216 regs, 185 KiB, 1 per SM, double-buffered (the default now)
#   h32n64w8s2l1  208 regs, 112 KiB, 1 per SM, single-buffered
#   h16n32w8s5l1  128 regs,  92 KiB, 2 per SM, double-buffered; two head blocks read the cache
#   h16n16w8s5l1  122 regs,  55 KiB, 2 per SM, double-buffered; (the second one mostly from L2)
# Output columns split over 2 or 4 programs (`split_l`; each reads whole tiles for the scores,
# then its columns again from L2). A 32-row tile is below wgmma's 64 (mma.sync from shared
# memory); block_h 64 pads Kimi-Linear's 32 heads to reach wgmma, and a quarter of the 512-wide
# accumulator keeps it from spilling. Triton 3.9 (not yet seen with 3.6):
#   h32n64w8s4l2  168 regs, 145 KiB, mma.sync
#   h32n32w8s5l2  128 regs, 143 KiB, mma.sync
#   h32n32w8s4l2  128 regs,  90 KiB, mma.sync, 2 per SM
#   h64n32w8s4l2  238 regs, 176 KiB, wgmma
#   h64n32w8s3l4  186 regs, 160 KiB, wgmma
#   h64n32w4s4l4  168 regs, 160 KiB, wgmma
#   h64n32w4s5l4  196 regs, 205 KiB, wgmma
#   h64n16w4s5l4  196 regs, 138 KiB, wgmma
KERNEL_CONFIGS = MLA_KERNEL_CHOICES
PROGRAMS_PER_SM = [1, 2, 4]
ROTATE_BYTES = 256 * 2**20


def make_case(batch: int, ctx: int, block_size: int, device: str, dtype: torch.dtype, seed: int,
              copies: int = 1):  # fmt: skip
    """Queries and a paged cache; `copies` block tables over disjoint blocks of one pool
    (`block_tables` is the first, `tables` all of them)."""
    gen = torch.Generator(device=device).manual_seed(seed)
    max_blocks = -(-ctx // block_size)
    num_blocks = batch * max_blocks
    q = torch.randn(batch, HEADS, LATENT + ROPE, generator=gen, device=device, dtype=dtype)
    cache = torch.randn(
        copies * num_blocks, block_size, LATENT + ROPE, generator=gen, device=device, dtype=dtype
    )
    tables = torch.randperm(num_blocks, generator=gen, device=device).view(batch, max_blocks)
    tables = [(tables + i * num_blocks).to(torch.int32) for i in range(copies)]
    case = dict(
        q_latent=q[..., :LATENT],
        q_pe=q[..., LATENT:],
        kv_cache=cache,
        block_tables=tables[0],
        seq_lens=torch.full((batch,), ctx, dtype=torch.int32, device=device),
        scale=192**-0.5,
    )
    return case, tables


def kernel_name(kernel: tuple[int, int, int, int, int]) -> str:
    return "h{}n{}w{}s{}l{}".format(*kernel)


def name(config: MlaDecodeConfig, programs_per_sm: int | None = None) -> str:
    c = config
    kernel = kernel_name((c.block_h, c.block_n, c.num_warps, c.num_stages, c.split_l))
    per_sm = "p?" if programs_per_sm is None else f"p{programs_per_sm}"
    return f"{kernel} {per_sm} x{c.num_splits}"


def split_candidates(
    batch: int, ctx: int, kernel: tuple[int, int, int, int, int], sms: int
) -> dict[int, int]:
    """Split count -> the fewest programs per SM that give it (`mla_num_splits`)."""
    block_h, split_l = kernel[0], kernel[4]
    counts = {}
    for per_sm in PROGRAMS_PER_SM:
        splits = mla_num_splits(batch, HEADS, block_h, split_l, ctx, sms, per_sm)
        counts.setdefault(splits, per_sm)
    return counts


def ref_scratch_bytes(batch: int, ctx: int) -> int:
    # The reference's fp32 gather of every table entry, its 16-bit source, scores and probabilities.
    return batch * ctx * (LATENT + ROPE) * (4 + 2) + 2 * batch * HEADS * ctx * 4


def dry_run(block_size: int) -> int:
    device = "cuda" if torch.cuda.is_available() else "cpu"
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    ctx = 3 * block_size + 1
    case, _ = make_case(2, ctx, block_size, device, dtype, seed=0)
    ref = mla_decode_paged_ref(**case)
    results = {"default": mla_decode_paged(**case)}
    for config in (MlaDecodeConfig(1, 32, 32, 8, 2), MlaDecodeConfig(5, 32, 16, 8, 5),
                   MlaDecodeConfig(3, 16, 64, 4, 2), MlaDecodeConfig(3, 64, 32, 4, 4, split_l=4),
                   MlaDecodeConfig(1, 32, 16, 8, 4, split_l=2)):  # fmt: skip
        results[name(config)] = launch_mla_decode(**case, config=config)
    err = max((got.float() - ref.float()).abs().max().item() for got in results.values())
    path = "Triton" if use_triton(torch.device(device)) else "the torch reference"
    print(
        f"dry run on {device} via {path}: batch 2, ctx {ctx}, {', '.join(results)}: "
        f"max |diff| {err:.2e}"
    )
    return 0 if err < 2**-7 else 1


def sweep_case(
    batch: int, ctx: int, args, kernels: list, copy: float, sms: int, smem: int
) -> list[dict[str, object]]:
    from benchmark_rmsnorm_gated_fp8_per_token import time_graph
    from triton.runtime.errors import OutOfResources

    cache_bytes = batch * ctx * (LATENT + ROPE) * 2
    copies = max(1, min(-(-ROTATE_BYTES // cache_bytes), 64))
    case, tables = make_case(batch, ctx, args.block_size, "cuda", torch.bfloat16, batch, copies)
    capacity = case["block_tables"].shape[1] * args.block_size
    heuristic = mla_decode_config(batch, HEADS, LATENT, capacity, sms, smem)
    configs = {}  # config -> programs per SM it was derived from (None: the heuristic's own)
    for kernel in kernels:
        for splits, per_sm in split_candidates(batch, ctx, kernel, sms).items():
            configs[MlaDecodeConfig(splits, *kernel[:4], split_l=kernel[4])] = per_sm
    configs.setdefault(heuristic, None)
    skipped = set()
    # Large caches take long per call: fewer calls per graph, so the sweep stays short.
    calls = max(copies, args.graph_calls if cache_bytes < 64 * 2**20 else 2)
    reps = args.reps if cache_bytes < 64 * 2**20 else 5
    rows = []
    for config, per_sm in sorted(configs.items(), key=lambda item: name(*item)):
        kernel = name(config).split(" ")[0]
        if kernel in skipped:
            continue
        cycle = itertools.cycle(tables)

        def call(config=config, cycle=cycle):
            return launch_mla_decode(**dict(case, block_tables=next(cycle)), config=config)

        try:
            us = time_graph(call, calls, reps=reps)
        except OutOfResources as e:
            print(f"      {kernel} skipped: {e}", flush=True)
            skipped.add(kernel)
            continue
        gbps = cache_bytes / us / 1e3
        rows.append(dict(
            batch=batch, ctx=ctx, block_size=args.block_size, config=name(config, per_sm),
            block_h=config.block_h, block_n=config.block_n, num_warps=config.num_warps,
            num_stages=config.num_stages, split_l=config.split_l, programs_per_sm=per_sm,
            num_splits=config.num_splits, heuristic=config == heuristic, us=round(us, 2),
            gbps=round(gbps, 1),
            pct_copy=round(100 * gbps / copy, 1), cache_mib=round(cache_bytes / 2**20, 1),
            copy_gbps=round(copy, 1), ref_us=None,
        ))  # fmt: skip
    if args.ref and ref_scratch_bytes(batch, ctx) <= args.ref_max_gib * 2**30:
        ref_us = time_graph(lambda: mla_decode_paged_ref(**case), 2, reps=5)
        for row in rows:
            row["ref_us"] = round(ref_us, 2)
    return rows


def report(rows: list[dict[str, object]]) -> None:
    first = rows[0]
    best = min(rows, key=lambda r: r["us"])
    chosen = next(r for r in rows if r["heuristic"])

    def cell(r):
        return f"{r['config']:>24} {r['us']:8.2f} us {r['pct_copy']:5.1f}%"

    print(
        f"B={first['batch']:>3} ctx={first['ctx']:>6} {first['cache_mib']:7.1f} MiB  "
        f"heuristic {cell(chosen)}  best {cell(best)}  ({chosen['us'] / best['us']:.2f}x best)",
        flush=True,
    )
    by_kernel = {}
    for r in rows:
        key = r["config"].split(" ")[0]
        if key not in by_kernel or r["us"] < by_kernel[key]["us"]:
            by_kernel[key] = r
    cells = [cell(r) for r in sorted(by_kernel.values(), key=lambda r: r["us"])]
    for i in range(0, len(cells), 3):
        print("      " + " |".join(cells[i : i + 3]))
    if first["ref_us"] is not None:
        print(f"      torch reference {first['ref_us']:.2f} us")


def tuned_table(rows: list[dict[str, object]]) -> None:
    """The best config of every case as `_TUNED` lines (mla_decode.py): the heuristic's own
    config stands for itself only, so the best one with a programs-per-SM count is taken."""
    print("best per case, as _TUNED entries (batch bucket, context bucket): (block_h, block_n, "
          "num_warps, num_stages, split_l, programs_per_sm):")  # fmt: skip
    for key in sorted({(r["batch"], r["ctx"]) for r in rows}):
        case = [r for r in rows if (r["batch"], r["ctx"]) == key and r["programs_per_sm"]]
        if not case:
            continue
        b = min(case, key=lambda r: r["us"])
        fields = ("block_h", "block_n", "num_warps", "num_stages", "split_l", "programs_per_sm")
        entry = ", ".join(str(b[f]) for f in fields)
        print(f"    {key}: ({entry}),  # {b['us']:.1f} us, {b['pct_copy']:.1f}% of copy")


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
    parser.add_argument("--reps", type=int, default=10, help="graph replays per timing")
    parser.add_argument("--copy-gib", type=float, default=2.0, help="size of the copy (>= 1)")
    parser.add_argument("--ref", action="store_true", help="also time the torch reference")
    parser.add_argument(
        "--ref-max-gib", type=float, default=24.0, help="skip the reference above this scratch"
    )
    parser.add_argument(
        "--configs", nargs="+", metavar="NAME",
        help="sweep only these kernel configs (h{block_h}n{block_n}w{warps}s{stages}l{split_l}); "
        "default: all of KERNEL_CONFIGS",
    )  # fmt: skip
    parser.add_argument("--csv", help="write every measurement to this CSV file")
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
    kernels = KERNEL_CONFIGS
    if args.configs:
        known = {kernel_name(k): k for k in KERNEL_CONFIGS}
        unknown = [c for c in args.configs if c not in known]
        if unknown:
            parser.error(f"unknown --configs {unknown}; known: {sorted(known)}")
        kernels = [known[c] for c in args.configs]

    # Imported here: that module needs Triton, which --dry-run on a bare CPU may lack.
    from benchmark_rmsnorm_gated_fp8_per_token import copy_gbps, write_csv

    props = torch.cuda.get_device_properties(0)
    sms = props.multi_processor_count
    smem = getattr(props, "shared_memory_per_block_optin", 0)  # as mla_decode_paged reads it
    copy = copy_gbps(args.copy_gib)
    print(f"{torch.cuda.get_device_name(0)}: copy {copy:.0f} GB/s (read + write), {sms} SMs")
    rows = []
    with torch.inference_mode():
        for ctx in args.contexts:
            for batch in args.batches:
                case_rows = sweep_case(batch, ctx, args, kernels, copy, sms, smem)
                rows += case_rows
                write_csv(args.csv, rows)  # after every case: an interrupted run keeps its rows
                report(case_rows)
                torch.cuda.empty_cache()
    tuned_table(rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
