"""Benchmark MLA paged decode (absorbed form): a sweep of the split-KV Triton kernel's launch
configurations at Kimi-Linear sizes (32 heads, latent 512, rope 64, bf16 cache), the splits merged
in a second launch ("two") and in the split launch ("one", the last program of each sequence and
head block merges), against the default choice of `mla_decode_config`.

Every sequence of a batch holds the full context; its blocks are scattered through the pool. The
block tables are `--capacity` tokens wide (default: the context), as the engine's are
`max_model_len` wide: the default launch is chosen from that width, the kernel splits each
sequence by its length. Each launch is timed as CUDA-graph replay (what a decode step pays), every
call of a replay reading its own copy of the cache, so that the cache is read from HBM and not from
L2 (the copies of one replay add up to >= 256 MiB). Per (batch, context):

  config     h{block_h}n{block_n}w{num_warps}s{num_stages}[c{chunks}] x{num_splits} {one|two};
             c{chunks}: the latent in 2 or 4 column chunks (`MlaDecodeConfig.latent_chunks`)
  us         `launch_mla_decode` (split kernel, + merge kernel for "two"), microseconds per call
  %copy      cache bytes read (N * ctx * (L + R) * 2 B) per second over the device's copy
             bandwidth, measured in the same run: an eager `copy_` of --copy-gib GiB after
             warm-up, counting bytes read + written

Printed per case: the heuristic's config, the best config, the best one-launch and two-launch
configs, one against two launches at every split count of the heuristic's kernel config (where
the default's `_FUSED_MERGE_MAX_BYTES` should put the crossover), and every kernel config's best.
Split counts swept (or `--splits`): those giving about 1, 2 and 4 programs per SM and 1, 2 and 4
tiles per split (at most 512), and the heuristic's. `--merge` limits the merge forms. `--csv`
writes every measurement; `--ref` also times the torch reference (gathers the whole context in
fp32) where it fits in --ref-max-gib of scratch memory.

    python benchmarks/kernels/benchmark_mla_decode.py --csv mla_decode.csv
    python benchmarks/kernels/benchmark_mla_decode.py --contexts 1024 --capacity 8448 \
        --block-size 16 --configs 32,64,8,5 16,64,8,5 --splits 2 4 8 16 32 65
    python benchmarks/kernels/benchmark_mla_decode.py --batches 1 16 64 --contexts 1024 8192 \
        32768 --capacity 32768 --block-size 16 --configs 32,64,8,5 32,64,8,5,c2 32,64,8,5,c4 \
        16,64,8,5 16,64,8,5,c2 16,64,8,5,c4

A kernel config is `block_h,block_n,num_warps,num_stages`, with `,c2` or `,c4` after it for the
latent in that many column chunks.

`--dry-run` runs one tiny case once per config kind (one split, several merged both ways, two head
blocks, latent chunks), checked against the reference and one merge against the other, untimed;
without a GPU run it under the Triton interpreter: TRITON_INTERPRET=1 python ... --dry-run
"""

import argparse
import itertools
import sys
from dataclasses import replace

import torch
from kernel_bench import (
    add_common_args,
    note_dry_run_ignores,
    print_copy_gbps,
    require_gpu,
    round_like_the_gpu_if_interpreting,
    time_graph,
    write_csv,
)

from vllm.models.kimi_k3.amd.ops.mla_decode import (
    launch_mla_decode,
    mla_decode_paged,
    mla_decode_paged_ref,
)
from vllm.models.kimi_k3.amd.ops.mla_decode_config import (
    DECODE_COUNTERS,
    MlaDecodeConfig,
    mla_decode_config,
)
from vllm.triton_utils import use_triton
from vllm.utils.cli import nonnegative_int, positive_float, positive_int, run_main

HEADS, LATENT, ROPE = 32, 512, 64
BATCHES = [1, 4, 16, 64]
CONTEXTS = [1024, 8192, 32768]
# (block_h, block_n, num_warps, num_stages), with what ptxas reports on sm_90 (Triton 3.6):
# registers a thread, shared memory, programs an SM holds, and cache tiles in flight. Below 5
# stages the block-table indirection leaves the tiles single-buffered (see `mla_decode_config`).
#   h32n32w8s2  128 regs,  74 KiB, 2 per SM, single-buffered (the default before this sweep)
#   h32n16w8s2  128 regs,  55 KiB, 2 per SM, single-buffered
#   h32n32w8s5  218 regs, 111 KiB, 1 per SM, double-buffered
#   h32n32w8s7  228 regs, 147 KiB, 1 per SM, triple-buffered
#   h32n64w8s5  216 regs, 185 KiB, 1 per SM, double-buffered (the default now)
#   h32n64w8s2  208 regs, 112 KiB, 1 per SM, single-buffered
#   h16n32w8s5  128 regs,  92 KiB, 2 per SM, double-buffered; two head blocks read the cache
#   h16n16w8s5  122 regs,  55 KiB, 2 per SM, double-buffered; (the second one mostly from L2)
#   h16n64w8s5  128 regs, 165 KiB, 1 per SM, double-buffered (Triton 3.9); half the tl.dot
#               work of h32n64 a program, and half the partial bytes a one-launch merge reads
KERNEL_CONFIGS = ["32,32,8,2", "32,16,8,2", "32,32,8,5", "32,32,8,7", "32,64,8,5", "32,64,8,2",
                  "16,32,8,5", "16,16,8,5", "16,64,8,5"]  # fmt: skip
PROGRAMS_PER_SM = [1, 2, 4]
TILES_PER_SPLIT = [1, 2, 4]
MAX_SWEEP_SPLITS = 512
ROTATE_BYTES = 256 * 2**20
MERGES = {"both": (False, True), "one": (True,), "two": (False,)}


def make_case(batch: int, ctx: int, block_size: int, device: str, dtype: torch.dtype, seed: int,
              copies: int = 1, capacity: int = 0):  # fmt: skip
    """Queries and a paged cache; `copies` block tables over disjoint blocks of one pool
    (`block_tables` is the first, `tables` all of them), `capacity` tokens wide (at least the
    context; entries past it are block 0, never read)."""
    gen = torch.Generator(device=device).manual_seed(seed)
    ctx_blocks = -(-ctx // block_size)
    max_blocks = max(ctx_blocks, -(-capacity // block_size))
    num_blocks = batch * ctx_blocks
    q = torch.randn(batch, HEADS, LATENT + ROPE, generator=gen, device=device, dtype=dtype)
    cache = torch.randn(
        copies * num_blocks, block_size, LATENT + ROPE, generator=gen, device=device, dtype=dtype
    )
    tables = torch.randperm(num_blocks, generator=gen, device=device).view(batch, ctx_blocks)
    pad = torch.zeros(batch, max_blocks - ctx_blocks, dtype=torch.int32, device=device)
    tables = [torch.cat([(tables + i * num_blocks).to(torch.int32), pad], 1) for i in range(copies)]
    case = dict(
        q_latent=q[..., :LATENT],
        q_pe=q[..., LATENT:],
        kv_cache=cache,
        block_tables=tables[0],
        seq_lens=torch.full((batch,), ctx, dtype=torch.int32, device=device),
        scale=192**-0.5,
    )
    return case, tables


def name(config: MlaDecodeConfig) -> str:
    c = config
    merge = "" if c.num_splits == 1 else (" one" if c.fused_merge else " two")
    chunks = "" if c.latent_chunks == 1 else f"c{c.latent_chunks}"
    return f"h{c.block_h}n{c.block_n}w{c.num_warps}s{c.num_stages}{chunks} x{c.num_splits}{merge}"


def kernel_name(config: MlaDecodeConfig) -> str:
    return name(config).split(" ")[0]


def parse_kernel_config(text: str) -> tuple[int, int, int, int, int]:
    """`block_h,block_n,num_warps,num_stages`, with `,c2` or `,c4` after it for the latent in
    that many column chunks: the four numbers and the chunk count (1 without)."""
    fields = text.split(",")
    chunks = 1
    if len(fields) == 5 and fields[-1] in ("c2", "c4"):
        chunks = int(fields.pop()[1:])
    try:
        values = tuple(int(v) for v in fields)
    except ValueError:
        values = ()
    if len(values) != 4:
        raise ValueError(
            f"kernel config {text!r} must be block_h,block_n,num_warps,num_stages[,c2|,c4]"
        )
    return (*values, chunks)


def split_candidates(batch: int, ctx: int, block_h: int, block_n: int, sms: int) -> list[int]:
    head_blocks = -(-HEADS // block_h)
    tiles = -(-ctx // block_n)
    most = max(1, min(tiles, MAX_SWEEP_SPLITS))
    counts = {round(f * sms / (batch * head_blocks)) for f in PROGRAMS_PER_SM}
    counts |= {-(-tiles // t) for t in TILES_PER_SPLIT}
    return sorted({max(1, min(c, most)) for c in counts})


def ref_scratch_bytes(batch: int, capacity: int) -> int:
    # The reference's fp32 gather of every table entry, its 16-bit source, scores and probabilities.
    return batch * capacity * (LATENT + ROPE) * (4 + 2) + 2 * batch * HEADS * capacity * 4


def dry_run(block_size: int, device: str) -> int:
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    ctx = 3 * block_size + 1
    case, _ = make_case(2, ctx, block_size, device, dtype, seed=0, capacity=5 * block_size)
    ref = mla_decode_paged_ref(**case)
    counters = torch.zeros(DECODE_COUNTERS, dtype=torch.int32, device=device)
    results = {"default": mla_decode_paged(**case, counters=counters)}
    for config in (MlaDecodeConfig(1, 32, 32, 8, 2), MlaDecodeConfig(5, 32, 16, 8, 5),
                   MlaDecodeConfig(3, 16, 64, 4, 2),
                   MlaDecodeConfig(1, 32, 32, 8, 2, latent_chunks=2),
                   MlaDecodeConfig(3, 16, 64, 4, 2, latent_chunks=4)):  # fmt: skip
        for fused in (False, True) if config.num_splits > 1 else (False,):
            config = replace(config, fused_merge=fused)
            results[name(config)] = launch_mla_decode(**case, config=config, counters=counters)
    # Relative to the output's magnitude: bf16 rounds the probabilities and the output (2^-9 each).
    err = max((got.float() - ref.float()).abs().max().item() for got in results.values())
    err /= ref.float().abs().max().item()
    same = all(
        torch.equal(results[key], results[key.replace(" one", " two")])
        for key in results
        if key.endswith(" one")
    )
    print(
        f"dry run on {device} via Triton: batch 2, ctx {ctx}, {', '.join(results)}: "
        f"max |diff| / max |ref| {err:.2e}; one launch == two launches: {same}; counters at 0: "
        f"{not counters.any().item()}"
    )
    return 0 if err < 2**-7 and same and not counters.any().item() else 1


def sweep_case(
    batch: int, ctx: int, args, copy: float, sms: int, smem: int
) -> list[dict[str, object]]:
    from triton.runtime.errors import OutOfResources

    cache_bytes = batch * ctx * (LATENT + ROPE) * 2
    copies = max(1, min(-(-ROTATE_BYTES // cache_bytes), 64))
    case, tables = make_case(batch, ctx, args.block_size, "cuda", torch.bfloat16, batch, copies,
                             args.capacity)  # fmt: skip
    capacity = case["block_tables"].shape[1] * args.block_size
    # What the MLA layer launches: it holds DECODE_COUNTERS counters.
    heuristic = mla_decode_config(batch, HEADS, LATENT, capacity, sms, smem,
                                  counters=DECODE_COUNTERS)  # fmt: skip
    configs = {heuristic}
    for block_h, block_n, warps, stages, chunks in args.kernel_configs:
        splits_swept = args.splits or split_candidates(batch, ctx, block_h, block_n, sms)
        for splits in splits_swept:
            for fused in MERGES[args.merge] if splits > 1 else (False,):
                configs.add(MlaDecodeConfig(splits, block_h, block_n, warps, stages, fused,
                                            chunks))  # fmt: skip
    counters = torch.zeros(DECODE_COUNTERS, dtype=torch.int32, device="cuda")
    # Large caches take long per call: fewer calls per graph, so the sweep stays short.
    calls = max(copies, args.graph_calls if cache_bytes < 64 * 2**20 else 2)
    reps = args.reps if cache_bytes < 64 * 2**20 else 5
    rows = []
    for config in sorted(configs, key=lambda c: (kernel_name(c), c.num_splits, c.fused_merge)):
        cycle = itertools.cycle(tables)

        def call(config=config, cycle=cycle):
            return launch_mla_decode(**dict(case, block_tables=next(cycle)), config=config,
                                     counters=counters)  # fmt: skip

        try:
            us = time_graph(call, calls, reps=reps)
        except OutOfResources as error:  # raised by the eager warm-up, before any capture
            print(f"      {name(config)}: skipped, {error}", flush=True)
            continue
        gbps = cache_bytes / us / 1e3
        merge = "none" if config.num_splits == 1 else ("one" if config.fused_merge else "two")
        rows.append(dict(
            batch=batch, ctx=ctx, capacity=capacity, block_size=args.block_size,
            config=name(config), block_h=config.block_h, block_n=config.block_n,
            num_warps=config.num_warps, num_stages=config.num_stages,
            num_splits=config.num_splits, merge=merge, latent_chunks=config.latent_chunks,
            heuristic=config == heuristic,
            us=round(us, 2), gbps=round(gbps, 1), pct_copy=round(100 * gbps / copy, 1),
            cache_mib=round(cache_bytes / 2**20, 1), copy_gbps=round(copy, 1), ref_us=None,
        ))  # fmt: skip
    if counters.any():
        raise RuntimeError("a one-launch merge left an arrival counter set")
    if args.ref and ref_scratch_bytes(batch, capacity) <= args.ref_max_gib * 2**30:
        ref_us = time_graph(lambda: mla_decode_paged_ref(**case), 2, reps=5)
        for row in rows:
            row["ref_us"] = round(ref_us, 2)
    return rows


def report(rows: list[dict[str, object]]) -> None:
    first = rows[0]
    best = min(rows, key=lambda r: r["us"])
    chosen = next(r for r in rows if r["heuristic"])

    def cell(r):
        return f"{r['config']:>26} {r['us']:8.2f} us {r['pct_copy']:5.1f}%"

    print(
        f"B={first['batch']:>3} ctx={first['ctx']:>6} cap={first['capacity']:>6} "
        f"{first['cache_mib']:7.1f} MiB  heuristic {cell(chosen)}  best {cell(best)}  "
        f"({chosen['us'] / best['us']:.2f}x best)",
        flush=True,
    )
    by_merge = {}
    for r in rows:
        if r["merge"] != "none" and (
            r["merge"] not in by_merge or r["us"] < by_merge[r["merge"]]["us"]
        ):
            by_merge[r["merge"]] = r
    if by_merge:
        print(
            "      best " + " | best ".join(f"{k}: {cell(r)}" for k, r in sorted(by_merge.items()))
        )
    # One against two launches per split count, at the heuristic's kernel config.
    kernel = chosen["config"].split(" ")[0]
    pairs = {}
    for r in rows:
        if r["config"].startswith(kernel + " ") and r["merge"] != "none":
            pairs.setdefault(r["num_splits"], {})[r["merge"]] = r["us"]
    cells = [
        f"x{splits} {p['one']:.2f}/{p['two']:.2f}"
        for splits, p in sorted(pairs.items())
        if len(p) == 2
    ]
    if cells:
        print(f"      {kernel} one/two launches, us: " + " | ".join(cells))
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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--batches", type=positive_int, nargs="+", default=BATCHES, help="batch sizes"
    )
    parser.add_argument(
        "--contexts", type=positive_int, nargs="+", default=CONTEXTS, help="tokens per sequence"
    )
    parser.add_argument(
        "--block-size", type=positive_int, default=64, help="tokens per cache block"
    )
    parser.add_argument(
        "--capacity", type=nonnegative_int, default=0,
        help="block-table width in tokens (the engine's max_model_len); default: the context",
    )  # fmt: skip
    parser.add_argument(
        "--splits", type=int, nargs="+", help="split counts to sweep (default: see above)"
    )
    parser.add_argument(
        "--merge", choices=sorted(MERGES), default="both",
        help="merge forms to sweep: in the split launch (one), in a second launch (two), both",
    )  # fmt: skip
    parser.add_argument(
        "--configs", nargs="+", default=KERNEL_CONFIGS, dest="kernel_configs",
        help="kernel configs to sweep, block_h,block_n,num_warps,num_stages[,c2|,c4] (latent "
        "chunks)",
    )  # fmt: skip
    parser.add_argument(
        "--graph-calls", type=positive_int, default=20, help="calls per captured graph"
    )
    parser.add_argument("--reps", type=positive_int, default=10, help="graph replays per timing")
    parser.add_argument("--ref", action="store_true", help="also time the torch reference")
    parser.add_argument(
        "--ref-max-gib",
        type=positive_float,
        default=24.0,
        help="skip the reference above this scratch",
    )
    add_common_args(
        parser, csv="write every measurement to this CSV file",
        dry_run="one tiny checked case, untimed (on CPU: under TRITON_INTERPRET=1)",
    )  # fmt: skip
    args = parser.parse_args(argv)
    try:
        args.kernel_configs = [parse_kernel_config(c) for c in args.kernel_configs]
    except ValueError as e:
        parser.error(str(e))
    if args.dry_run:
        # The dry run launches the kernels at fixed configs (launch_mla_decode), which have no
        # torch fallback: without this, Triton's "0 active drivers" traceback.
        device = "cuda" if torch.cuda.is_available() else "cpu"
        if not use_triton(torch.device(device)):
            parser.error(
                "--dry-run: the kernel runs on CPU only under TRITON_INTERPRET=1"
                if device == "cpu"
                else "--dry-run: Triton is not importable"
            )
        note_dry_run_ignores(parser, args, used=("block_size",))
        round_like_the_gpu_if_interpreting()
        return dry_run(args.block_size, device)
    require_gpu(parser, gpu="CUDA or ROCm GPU")
    if args.splits and min(args.splits) < 1:
        parser.error("--splits must be >= 1")

    props = torch.cuda.get_device_properties(0)
    sms = props.multi_processor_count
    smem = getattr(props, "shared_memory_per_block_optin", 0)  # as mla_decode_paged reads it
    copy = print_copy_gbps(args.copy_gib, f", {sms} SMs")
    rows = []
    with torch.inference_mode():
        for ctx in args.contexts:
            for batch in args.batches:
                case_rows = sweep_case(batch, ctx, args, copy, sms, smem)
                rows += case_rows
                write_csv(args.csv, rows)  # after every case: an interrupted run keeps its rows
                report(case_rows)
                torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(run_main(main))
