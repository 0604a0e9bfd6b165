"""Benchmark FusedMoE's routed-expert paths on Kimi-Linear-48B expert shapes.

Shapes (`--shape`): `kimi-linear` (the default), 256 experts, top-8, hidden 2304, intermediate
1024; `kimi-k3-tp8`, Kimi-K3's routed experts on one GPU at TP 8, 896 experts, top-16, the latent
MoE's hidden 3584, intermediate 3072 / 8 = 384. bf16, tokens 1-512 (decode sizes).
Routing: `grouped_topk` (sigmoid, score-correction bias, renormalised) of random router logits.
Activation: SiLU (Kimi-Linear's), or with `--activation situ` Kimi-K3's SiTU (`SituAndMul(4,
25)`), which the Triton paths fuse as they fuse SiLU and the others apply in torch.

  grouped   torch._grouped_mm over rows sorted by expert (sync-free on sm90 / sm100 only)
  triton    moe_experts_triton: GEMV-style gate/up + activation and down + weighted-sum
            kernels, at its default blocks or at each --triton-configs entry (a sweep; a `u`
            after the gate/up part unrolls that kernel's steps over H, `gate_up_unroll`;
            `default` for the defaults, to time them beside other entries in one process)
  tgrouped  moe_experts_triton_grouped: rows grouped by expert on the device, Triton GEMM
            gate/up + activation and down kernels, weighted sum; at its defaults or at each
            --tgrouped-configs entry (`default` as for triton)
  grouping  tgrouped's grouping of the rows by expert alone (not in the default --paths):
            `group_rows` (one kernel; two, chunked, past 32768 rows) as `grouping`, and
            `group_rows_reference` (a torch sort, what prefills past 32768 rows ran before the
            chunked kernels) as `grouping:sort`; time only
  gathered  the chosen experts' weights gathered per (token, slot), then two bmm
  loop      the per-expert Python loop (syncs the host; timed eagerly, not in a CUDA graph)

`--routing-histogram FILE` routes by recorded rows per expert instead: a JSON list with one list
per MoE layer of each expert's routed rows, as the twenty-sixth run's `prefill_tail.py` records
them from the engine's 8k prefill (docs/perf_h200_2026-12-04c/c101_hist_0.json: the dummy 48B
model's routing, median 46-99 rows an expert, the largest 1998-3616, a fifth of the experts
idle), where random router logits give every expert about the mean. Each layer's tokens are its
routed rows over top-k; the rows of one expert go to distinct tokens, the tokens in a seeded
random order; a column past the routed experts (the fused shared expert's) must hold every token
and needs `--fused-shared-experts`. `--layers` picks layers (default all); the last lines sum
each path over them, the routed experts of one prefill step of that many layers.

The sync-free paths are timed as CUDA-graph replay of --graph-calls back-to-back calls (what a
decode step pays), or with `--timing flushed` one call per replay after an L2 flush (prefill
sizes, where a call moves GBs and host time is no concern). Each row also gives the TFLOP/s of
the routed rows' two GEMMs (2 x rows x 3 x hidden x intermediate FLOPs, the shared slots
included), the measure at prefill sizes. Expert-weight bytes touched are the
distinct experts the router chose in the run times the bytes of one expert (w13 and w2); the
bandwidth is reported against an eager `copy_` of --copy-gib GiB measured in the same run after a
warm-up (read + write bytes / time).

`--shared-expert` times the whole `KimiMoE` block instead (router, routed experts and the shared
expert, graph-replayed) in its two layouts: `fused` (the shared expert is expert 256 of the routed
kernels, `VLLM_KIMI_FUSE_SHARED_EXPERTS=1`) and `separate` (the shared MLP and an add after the
routed experts); bytes are the chosen experts', the shared expert's and the router's weights.

The last lines suggest `TRITON_MAX_ROWS` (vllm/model_executor/layers/fused_moe/experts.py): the
largest T * K up to which the fastest triton config beats grouped at every measured size, and
`TRITON_GROUPED_MAX_ROWS`: the same for the fastest tgrouped config.

    python benchmarks/kernels/benchmark_moe.py --csv moe.csv
    python benchmarks/kernels/benchmark_moe.py --paths grouped triton --tokens 1 8 16 \
        --triton-configs 16,256,4/8,256,8 32,128,4/16,256,8 8,256,4/8,128,4 16,512,8/4,512,8
    python benchmarks/kernels/benchmark_moe.py --paths grouped triton tgrouped \
        --tokens 16 32 64 128 256 512 --tgrouped-configs 16/64,128,4,3/64,128,4,3 \
        16/128,64,4,4/128,64,4,4 32/64,128,4,3/64,128,4,3
    python benchmarks/kernels/benchmark_moe.py --paths grouping --tokens 1 64 256 1024 4096 8192
    python benchmarks/kernels/benchmark_moe.py --shared-expert --tokens 1 8 64 256 1024
    python benchmarks/kernels/benchmark_moe.py --paths grouped --tokens 1024 8192 \
        --fused-shared-experts 1 --timing flushed    # prefill: one layer's routed experts
    python benchmarks/kernels/benchmark_moe.py --paths tgrouped --fused-shared-experts 1 \
        --timing flushed --routing-histogram docs/perf_h200_2026-12-04c/c101_hist_0.json
    python benchmarks/kernels/benchmark_moe.py --dry-run      # tiny shapes, CPU, no GPU needed

A triton config is `BLOCK_N,BLOCK_K,WARPS/BLOCK_H,BLOCK_I,WARPS`: gate/up kernel (intermediate
columns per program, hidden chunk per step, warps), then down kernel (hidden outputs per program,
intermediate chunk per step, warps); powers of two. A tgrouped config is
`BLOCK_M[+TAIL_M]/BLOCK_N,BLOCK_K,WARPS,STAGES/BLOCK_N,BLOCK_K,WARPS,STAGES`: rows per expert block
(and the rows of the tiles of an expert's last block where it holds at most TAIL_M; none without
it), then
the gate/up kernel (intermediate columns per program, hidden chunk per step, warps, pipeline
stages) and the down kernel (hidden outputs per program, intermediate chunk per step, warps,
stages); tiles are powers of two >= 16. A last `/tma` or `/ptr` loads the weights through TMA
descriptors or pointers (default: the path's choice for the device and size). On CPU the Triton
paths run only under TRITON_INTERPRET=1 (slow: keep --tokens small).
"""

import argparse
import functools
import json
import sys

import torch
from kernel_bench import (
    add_common_args,
    copy_gbps,
    note_dry_run_ignores,
    require_gpu,
    round_like_the_gpu_if_interpreting,
    time_eager,
    time_flushed,
    time_graph,
    write_csv,
)

from vllm.model_executor.layers.activation import SiluAndMul, SituAndMul
from vllm.model_executor.layers.fused_moe.experts import (
    TRITON_MAX_ROWS,
    grouped_mm_is_sync_free,
    moe_experts_gathered,
    moe_experts_grouped,
    moe_experts_loop,
)
from vllm.model_executor.layers.fused_moe.experts_triton import moe_experts_triton
from vllm.model_executor.layers.fused_moe.experts_triton_grouped import (
    default_tiles,
    moe_experts_triton_grouped,
)
from vllm.model_executor.layers.fused_moe.group_rows import group_rows, group_rows_reference
from vllm.model_executor.layers.fused_moe.router import RoutingParams, grouped_topk
from vllm.models.kimi_k3.amd.moe import KimiMoE
from vllm.transformers_utils.configs import KimiLinearConfig
from vllm.triton_utils import use_triton
from vllm.utils.cli import nonnegative_int, positive_int, run_main

PATHS = {
    "grouped": moe_experts_grouped,
    "triton": moe_experts_triton,
    "tgrouped": moe_experts_triton_grouped,
    "gathered": moe_experts_gathered,
    "loop": moe_experts_loop,
}
# Timed on request only: the grouping step of tgrouped, its kernel and its torch reference.
GROUPINGS = {"grouping": group_rows, "grouping:sort": group_rows_reference}
# Rows T * K = 8 ... 2048: the GEMV Triton sizes, the grouped Triton sizes, and the crossovers
# (the gathered path copies ~14 MB per row: keep it out of --tokens 512 runs).
TOKENS = [1, 2, 4, 8, 16, 32, 64, 128, 256]
KIMI_LINEAR = dict(experts=256, topk=8, hidden=2304, intermediate=1024)
# Kimi-K3's routed experts (896, top-16, latent hidden 3584, intermediate 3072) at TP 8, which
# shards the intermediate dim (FusedMoE).
SHAPES = {
    "kimi-linear": KIMI_LINEAR,
    "kimi-k3-tp8": dict(experts=896, topk=16, hidden=3584, intermediate=3072 // 8),
}
DRY_RUN = dict(experts=8, topk=2, hidden=64, intermediate=32)


def triton_config(text: str) -> tuple[str, dict[str, int | bool]]:
    """`BLOCK_N,BLOCK_K,WARPS[u]/BLOCK_H,BLOCK_I,WARPS` -> (path name, moe_experts_triton's
    keyword arguments); `u` unrolls the gate/up kernel's steps over H (`gate_up_unroll`).
    `default`: the defaults, named `triton` as without --triton-configs."""
    if text == "default":
        return "triton", {}
    names = ("block_n", "block_k", "gate_up_warps", "block_h", "block_i", "down_warps")
    unroll = "u/" in text
    try:
        values = [int(v) for part in text.replace("u/", "/").split("/", 1) for v in part.split(",")]
    except ValueError:
        values = []
    if len(values) != len(names) or "/" not in text or any(v < 1 or v & (v - 1) for v in values):
        raise argparse.ArgumentTypeError(
            f"{text!r} is not BLOCK_N,BLOCK_K,WARPS[u]/BLOCK_H,BLOCK_I,WARPS (powers of two)"
        )
    return f"triton[{text}]", dict(zip(names, values, strict=True), gate_up_unroll=unroll)


def tgrouped_config(text: str) -> tuple[str, dict[str, int | bool]]:
    """`BLOCK_M[+TAIL_M]/BLOCK_N,BLOCK_K,WARPS,STAGES/BLOCK_N,BLOCK_K,WARPS,STAGES[/tma|/ptr]`
    -> (path name, moe_experts_triton_grouped's keyword arguments); `default`: the defaults."""
    if text == "default":
        return "tgrouped", {}
    names = ("block_m", "block_n", "block_k", "gate_up_warps", "gate_up_stages",
             "down_block_n", "down_block_k", "down_warps", "down_stages")  # fmt: skip
    parts = text.split("/")
    extra: dict[str, int | bool] = {}
    if len(parts) == 4 and parts[3] in ("tma", "ptr"):
        extra["tma"] = parts.pop() == "tma"
    block_m, plus, tail = parts[0].partition("+")
    parts[0] = block_m
    try:
        values = [int(v) for part in parts for v in part.split(",")]
        # A config is the whole launch: without "+TAIL_M", no tail tiles.
        extra["tail_block_m"] = int(tail) if plus else 0
    except ValueError:
        values = []
    tiles = [values[i] for i in (0, 1, 2, 5, 6)] if len(values) == len(names) else []
    if plus and tiles:
        tiles.append(int(extra["tail_block_m"]))
    if (
        len(parts) != 3
        or len(values) != len(names)
        or any(v < 1 for v in values)
        or any(v < 16 or v & (v - 1) for v in tiles)
        or (plus and extra["tail_block_m"] >= values[0])
    ):
        raise argparse.ArgumentTypeError(
            f"{text!r} is not BLOCK_M[+TAIL_M]/BLOCK_N,BLOCK_K,WARPS,STAGES/BLOCK_N,BLOCK_K,"
            "WARPS,STAGES[/tma|/ptr] (tiles powers of two >= 16, TAIL_M below BLOCK_M)"
        )
    return f"tgrouped[{text}]", dict(zip(names, values, strict=True), **extra)


def suggest_max_rows(rows: list[dict[str, object]], family: str, above: int = 0) -> int | None:
    """Largest T * K above `above` such that the fastest config of `family` ("triton" or
    "tgrouped") beats grouped at it and every smaller size above `above` where both were
    measured; None if there is no such size measured by both (`above`: it never wins)."""
    best: dict[int, dict[str, float]] = {}
    for row in rows:
        path = str(row["path"]).split("[", 1)[0]
        if path in (family, "grouped"):
            by_path = best.setdefault(int(row["rows"]), {})
            by_path[path] = min(by_path.get(path, float("inf")), float(row["us"]))
    measured = sorted((n, p) for n, p in best.items() if len(p) == 2 and n > above)
    if not measured:
        return None
    limit = above
    for n, by_path in measured:
        if by_path[family] >= by_path["grouped"]:
            break
        limit = n
    return limit


def make_moe(
    shape: dict[str, int],
    tokens: int,
    device: torch.device,
    seed: int,
    fused_shared: int = 0,
    counts: list[int] | None = None,
):
    """Inputs of the routed experts; `fused_shared` shared experts appended as experts E, E + 1,
    ... that every token takes (Kimi-Linear with VLLM_KIMI_FUSE_SHARED_EXPERTS=1: 257, top-9).
    With `counts` (one layer of a histogram), `histogram_routing`'s routing and its tokens."""
    gen = torch.Generator(device=device).manual_seed(seed)
    e, h, i, k = shape["experts"], shape["hidden"], shape["intermediate"], shape["topk"]

    def randn(*size: int, scale: float) -> torch.Tensor:
        return (torch.randn(*size, generator=gen, device=device) * scale).to(torch.bfloat16)

    w13 = randn(e + fused_shared, 2 * i, h, scale=h**-0.5)
    w2 = randn(e + fused_shared, h, i, scale=i**-0.5)
    if counts is not None:
        weights, ids = histogram_routing(counts, e, k, fused_shared, device, seed)
        return randn(ids.shape[0], h, scale=1.0), w13, w2, weights, ids
    x = randn(tokens, h, scale=1.0)
    logits = torch.randn(tokens, e, generator=gen, device=device)
    bias = torch.randn(e, generator=gen, device=device) * 0.1
    weights, ids = grouped_topk(
        logits, bias, RoutingParams(e, k, num_fused_shared_experts=fused_shared)
    )
    return x, w13, w2, weights, ids


def read_histogram(path: str, experts: int, fused_shared: int, topk: int) -> list[list[int]]:
    """The layers' rows per expert in `path` (module docstring), checked against the shape:
    each layer `experts` routed counts (then `fused_shared` shared ones, each every token) whose
    sum is a multiple of `topk`, none above the layer's tokens. ValueError names what is
    wrong."""
    with open(path) as f:
        layers = json.load(f)
    if not isinstance(layers, list) or not layers:
        raise ValueError(f"{path}: expected a JSON list of per-layer lists of expert row counts")
    for i, counts in enumerate(layers):
        where = f"{path}: layer {i}"
        ok = isinstance(counts, list) and all(type(c) is int and c >= 0 for c in counts)
        if not ok or len(counts) not in (experts, experts + fused_shared):
            raise ValueError(
                f"{where}: expected {experts} routed counts (+ {fused_shared} shared, as "
                "--fused-shared-experts says), non-negative ints"
            )
        routed, shared = counts[:experts], counts[experts:]
        if sum(routed) % topk or not sum(routed):
            raise ValueError(f"{where}: {sum(routed)} routed rows are not tokens x top-{topk}")
        tokens = sum(routed) // topk
        if max(routed) > tokens or any(c != tokens for c in shared):
            raise ValueError(
                f"{where}: an expert takes a token at most once ({tokens} tokens), a shared "
                "expert every token"
            )
    return layers


def histogram_routing(
    counts: list[int], experts: int, topk: int, fused_shared: int, device: torch.device, seed: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Router outputs `(weights [T, topk + S] fp32, ids [T, topk + S] int64)` whose routed rows
    per expert are `counts[:experts]` (checked by `read_histogram`), with the `fused_shared` S
    shared columns after them at weight 1.0, as `grouped_topk` writes them. The experts' rows,
    the largest first, fill slot 0 of every token, then slot 1, ...: an expert's rows, no more
    than the tokens, land on distinct tokens. Then the tokens are shuffled."""
    routed = torch.tensor(counts[:experts])
    tokens = int(routed.sum()) // topk
    by_count = torch.argsort(routed, descending=True, stable=True)
    flat = torch.repeat_interleave(by_count, routed[by_count])
    gen = torch.Generator().manual_seed(seed)
    ids = flat.view(topk, tokens).t()[torch.randperm(tokens, generator=gen)]
    weights = torch.rand(tokens, topk, generator=gen) + 0.5
    weights /= weights.sum(dim=1, keepdim=True)
    shared = torch.arange(experts, experts + fused_shared).expand(tokens, fused_shared)
    ids = torch.cat([ids, shared], dim=1)
    weights = torch.cat([weights, torch.ones(tokens, fused_shared)], dim=1)
    return weights.to(device), ids.to(device)


def print_layer_sums(rows: list[dict[str, object]], flops_per_row: int) -> None:
    """Each path's time summed over the histogram's layers it ran (a prefill step's routed
    experts), with the TFLOP/s of the sum; a path given more than once (to see the noise) is
    summed per pass and the passes averaged."""
    for path in dict.fromkeys(str(r["path"]) for r in rows):
        mine = [r for r in rows if r["path"] == path and "layer" in r]
        layers = len({r["layer"] for r in mine})
        passes = len(mine) / layers
        us = sum(float(r["us"]) for r in mine) / passes
        tflops = sum(int(r["rows"]) for r in mine) / passes * flops_per_row / (us * 1e-6) / 1e12
        mean = f" (mean of {passes:g} passes)" if passes > 1 else ""
        print(f"{path}: {layers} layers {us / 1e3:.3f} ms{mean}, {tflops:.1f} TFLOP/s", flush=True)


def make_moe_blocks(
    shape: dict[str, int], device: torch.device, seed: int
) -> tuple[KimiMoE, KimiMoE, int]:
    """The `KimiMoE` block at `shape` with one shared expert of the routed size (Kimi-Linear's
    router: sigmoid, no groups, renormalised, scale 2.446), fused and separate, loaded from the
    same random checkpoint tensors; and the bytes of the weights every call reads (the shared
    expert and the fp32 router)."""
    e, h, i = shape["experts"], shape["hidden"], shape["intermediate"]
    config = KimiLinearConfig.from_dict(dict(
        hidden_size=h, num_hidden_layers=1, num_experts=e, num_experts_per_token=shape["topk"],
        moe_intermediate_size=i, num_shared_experts=1, routed_scaling_factor=2.446,
        moe_renormalize=True, hidden_act="silu", rms_norm_eps=1e-5,
        linear_attn_config={"kda_layers": [], "full_attn_layers": [1], "num_heads": 1,
                            "head_dim": 8},
    ))  # fmt: skip
    gen = torch.Generator(device=device).manual_seed(seed)

    def randn(*size: int, scale: float) -> torch.Tensor:
        return torch.randn(*size, generator=gen, device=device) * scale

    with torch.device(device):
        blocks = [KimiMoE(config, torch.bfloat16, fuse_shared_experts=f) for f in (True, False)]
    router = [("gate.weight", randn(e, h, scale=h**-0.5)),
              ("gate.e_score_correction_bias", randn(e, scale=0.1))]  # fmt: skip
    for block in blocks:
        block.load_weights(router)
    shared = ("gate_proj", "up_proj", "down_proj")
    parts = [(f"experts.{n}", ("w1", "w3", "w2")) for n in range(e)] + [("shared_experts", shared)]
    for name, names in parts:
        for part, (rows, cols) in zip(names, ((i, h), (i, h), (h, i)), strict=True):
            tensor = randn(rows, cols, scale=cols**-0.5)  # one at a time: memory stays small
            for block in blocks:
                block.load_weights([(f"{name}.{part}.weight", tensor)])
    every_call = 3 * h * i * 2 + (e * h + e) * 4
    return blocks[0], blocks[1], every_call


def shared_expert_rows(
    args: argparse.Namespace, shape: dict[str, int], device: torch.device, copy: float
) -> list[dict[str, object]]:
    """Time the fused and separate MoE blocks at each of `args.tokens`; print and return rows."""
    fused, separate, every_call = make_moe_blocks(shape, device, args.seed)
    expert_bytes = 3 * shape["intermediate"] * shape["hidden"] * 2
    rows = []
    for tokens in args.tokens:
        gen = torch.Generator(device=device).manual_seed(args.seed + tokens)
        x = torch.randn(tokens, shape["hidden"], generator=gen, device=device).to(torch.bfloat16)
        logits = torch.nn.functional.linear(x.float(), separate.gate_weight)
        ids = grouped_topk(logits, separate.e_score_correction_bias, separate.routing)[1]
        distinct = ids.unique().numel()  # host read, outside every timed region
        touched = distinct * expert_bytes + every_call
        for name, block in (("fused", fused), ("separate", separate)):

            def call(block=block, x=x):
                return block(x)

            graphed = device.type == "cuda"
            us = time_graph(call, args.graph_calls) if graphed else time_eager(call, device)
            gbps = touched / (us * 1e-6) / 1e9
            row = dict(tokens=tokens, rows=tokens * shape["topk"], path=f"block:{name}",
                       distinct_experts=distinct, weight_mb=round(touched / 1e6, 2),
                       timing="graph" if graphed else "eager", us=round(us, 2),
                       gbps=round(gbps, 1), pct_copy=round(100 * gbps / copy, 1),
                       copy_gbps=round(copy, 1))  # fmt: skip
            rows.append(row)
            write_csv(args.csv, rows)
            print(
                f"T={tokens:>4} {name:>8} ({row['timing']}) {us:10.2f} us  {distinct:>3} experts "
                f"+ shared {row['weight_mb']:9.2f} MB  {gbps:7.1f} GB/s  "
                f"{row['pct_copy']:5.1f}% of copy",
                flush=True,
            )
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--tokens", type=positive_int, nargs="+", default=TOKENS, help="tokens per call"
    )
    parser.add_argument(
        "--paths",
        nargs="+",
        default=list(PATHS),
        choices=[*PATHS, "grouping"],
        help="expert paths (grouping: tgrouped's grouping step alone)",
    )
    parser.add_argument(
        "--triton-configs",
        nargs="+",
        type=triton_config,
        metavar="BN,BK,W/BH,BI,W",
        help="time the triton path at each of these block configs, `default` for its defaults "
        "(without the option: its defaults)",
    )
    parser.add_argument(
        "--tgrouped-configs",
        nargs="+",
        type=tgrouped_config,
        metavar="BM/BN,BK,W,S/BN,BK,W,S",
        help="time the tgrouped path at each of these configs, `default` for its defaults "
        "(without the option: its defaults)",
    )
    parser.add_argument(
        "--shared-expert",
        action="store_true",
        help="time the KimiMoE block with the shared expert fused vs separate (not the paths)",
    )
    parser.add_argument(
        "--fused-shared-experts",
        type=nonnegative_int,
        default=0,
        help="append this many shared experts that every token takes (1: Kimi-Linear's fused "
        "layout, 257 experts, top-8 + 1)",
    )
    parser.add_argument(
        "--timing",
        choices=("graph", "flushed"),
        default="graph",
        help="graph: --graph-calls calls replayed back to back (decode sizes); flushed: one call "
        "per graph replay with L2 flushed before it (prefill sizes, e.g. --tokens 8192)",
    )
    parser.add_argument(
        "--graph-calls", type=positive_int, default=10, help="calls per captured graph"
    )
    parser.add_argument(
        "--routing-histogram",
        metavar="FILE",
        help="route by these recorded rows per expert, a JSON list per MoE layer (module "
        "docstring); the tokens come from it (--tokens is ignored)",
    )
    parser.add_argument(
        "--layers",
        type=nonnegative_int,
        nargs="+",
        help="with --routing-histogram: the layers to time (default: all)",
    )
    parser.add_argument(
        "--activation",
        choices=("silu", "situ"),
        default="silu",
        help="the experts' gated activation: silu (Kimi-Linear) or situ (Kimi-K3's SiTU, beta 4, "
        "linear beta 25); not with --shared-expert",
    )
    parser.add_argument(
        "--shape",
        choices=tuple(SHAPES),
        default="kimi-linear",
        help="expert shapes (module docstring); --shared-expert and --routing-histogram are "
        "kimi-linear's",
    )
    parser.add_argument("--seed", type=int, default=0, help="seed of weights and router logits")
    add_common_args(
        parser,
        dry_run="tiny shapes on the CPU, eager timing: checks the script, measures nothing useful",
    )
    args = parser.parse_args(argv)
    if args.shared_expert and args.activation != "silu":
        parser.error("--shared-expert times Kimi-Linear's block: SiLU only")
    if args.shape != "kimi-linear" and (args.shared_expert or args.routing_histogram):
        parser.error("--shared-expert and --routing-histogram are kimi-linear's (--shape)")
    if args.dry_run:
        ignored = ("shape", "copy_gib", "timing", "graph_calls")  # eager timing on the CPU
        note_dry_run_ignores(parser, args, ignored=ignored)
        round_like_the_gpu_if_interpreting()
        device, shape, copy_gib = torch.device("cpu"), DRY_RUN, 1 / 64
    else:
        require_gpu(parser)
        device, shape, copy_gib = torch.device("cuda"), SHAPES[args.shape], args.copy_gib

    # (tokens, one layer's rows per expert or None, its layer) per case
    cases: list[tuple[int, list[int] | None, int | None]] = [(t, None, None) for t in args.tokens]
    if args.layers and not args.routing_histogram:
        parser.error("--layers needs --routing-histogram")
    if args.routing_histogram:
        try:
            hist = read_histogram(
                args.routing_histogram, shape["experts"], args.fused_shared_experts, shape["topk"]
            )
        except (OSError, ValueError) as e:
            parser.error(f"--routing-histogram: {e}")
        layers = args.layers if args.layers is not None else range(len(hist))
        if any(i >= len(hist) for i in layers):
            parser.error(f"--layers: the histogram has layers 0-{len(hist) - 1}")
        cases = [(sum(hist[i][: shape["experts"]]) // shape["topk"], hist[i], i) for i in layers]
    expert_bytes = 3 * shape["intermediate"] * shape["hidden"] * 2  # gate, up, down in bf16
    flops_per_row = 2 * 3 * shape["intermediate"] * shape["hidden"]
    copy = copy_gbps(copy_gib, device)
    print(f"{device.type}: eager copy_ of {copy_gib:g} GiB: {copy:.0f} GB/s", flush=True)
    if args.shared_expert:
        with torch.inference_mode():
            shared_expert_rows(args, shape, device, copy)
        return 0
    act = SiluAndMul() if args.activation == "silu" else SituAndMul(4.0, 25.0)
    impls = []
    for name in args.paths:
        if name == "triton":
            for path, cfg in args.triton_configs or [("triton", {})]:
                impls.append((path, functools.partial(moe_experts_triton, **cfg)))
        elif name == "tgrouped":
            for path, cfg in args.tgrouped_configs or [("tgrouped", {})]:
                impls.append((path, functools.partial(moe_experts_triton_grouped, **cfg)))
        elif name == "grouping":
            impls.extend(GROUPINGS.items())
        else:
            impls.append((name, PATHS[name]))
    rows = []
    with torch.inference_mode():
        for tokens, counts, layer in cases:
            inputs = make_moe(shape, tokens, device, args.seed, args.fused_shared_experts, counts)
            distinct = inputs[-1].unique().numel()  # host read, outside every timed region
            touched = distinct * expert_bytes
            for name, impl in impls:
                row = dict(tokens=tokens, rows=inputs[-1].numel(), path=name,
                           activation=args.activation, distinct_experts=distinct,
                           weight_mb=round(touched / 1e6, 2))  # fmt: skip
                if layer is not None:
                    row["layer"] = layer
                graphed = device.type == "cuda" and name != "loop"
                if name == "grouped" and device.type == "cuda":
                    if not grouped_mm_is_sync_free(device, torch.bfloat16):
                        print(f"T={tokens:>4} grouped: skipped (torch's fallback syncs here)")
                        continue
                kernel = name.startswith(("triton", "tgrouped")) or name == "grouping"
                if kernel and not use_triton(device):
                    print(f"T={tokens:>4} {name}: skipped (on CPU only with TRITON_INTERPRET=1)")
                    continue
                if name in GROUPINGS:
                    block_m = default_tiles(row["rows"]).block_m
                    args_of_call = (inputs[-1], shape["experts"], block_m)
                else:
                    args_of_call = (*inputs, act)

                def call(impl=impl, args_of_call=args_of_call):
                    return impl(*args_of_call)

                if graphed and args.timing == "flushed":
                    us = time_flushed(call)
                elif graphed:
                    us = time_graph(call, args.graph_calls)
                else:
                    us = time_eager(call, device)
                if name in GROUPINGS:  # reads no weights: time only
                    row.update(weight_mb=0, timing="graph" if graphed else "eager", us=round(us, 2))
                    rows.append(row)
                    write_csv(args.csv, rows)
                    print(f"T={tokens:>4} {name:>13} ({row['timing']}) {us:10.2f} us", flush=True)
                    continue
                gbps = touched / (us * 1e-6) / 1e9
                tflops = row["rows"] * flops_per_row / (us * 1e-6) / 1e12
                row.update(timing=args.timing if graphed else "eager", us=round(us, 2),
                           gbps=round(gbps, 1), pct_copy=round(100 * gbps / copy, 1),
                           copy_gbps=round(copy, 1), tflops=round(tflops, 1))  # fmt: skip
                rows.append(row)
                write_csv(args.csv, rows)  # after every row: an interrupted run keeps its rows
                at = "" if layer is None else f"layer {layer:>2} "
                print(
                    f"{at}T={tokens:>4} {name:>8} ({row['timing']}) {us:10.2f} us  "
                    f"{distinct:>3} experts {row['weight_mb']:9.2f} MB  {gbps:7.1f} GB/s  "
                    f"{row['pct_copy']:5.1f}% of copy  {tflops:6.1f} TFLOP/s",
                    flush=True,
                )
    if args.routing_histogram:
        print_layer_sums(rows, flops_per_row)
    # The grouped Triton path serves only rows above TRITON_MAX_ROWS (the GEMV path's).
    suggestions = (("triton", 0, "TRITON_MAX_ROWS"),
                   ("tgrouped", TRITON_MAX_ROWS, "TRITON_GROUPED_MAX_ROWS"))  # fmt: skip
    for family, above, constant in suggestions:
        limit = suggest_max_rows(rows, family, above)
        if limit is not None:
            print(f"fastest {family} config beats grouped up to T * K = {limit} rows: {constant}")
    return 0


if __name__ == "__main__":
    sys.exit(run_main(main))
