"""Benchmark one KDA decode step: the launch variants of `fused_kda_decode`, and the unfused chain
against the fused decode + PTPC epilogue.

Shapes: Kimi-K3 per GPU at TP8 (12 heads x 128) and Kimi-Linear (32 heads x 128), batch 1-256.

Variant sweep (the op alone, with its gated-RMSNorm epilogue; with --quantize the engine's PTPC
call, `quantize=True`, whose FP8 quantization the V-split epilogue does), one line per (shape,
batch):

  v{block_v}w{num_warps}[e{shift_programs}][x]
                          `KdaDecodeConfig(block_v, num_warps, shift_programs)`; v128 is the
                          single kernel (v128w8 is the kernel before the V split), v64 and below
                          the V-split kernel plus its epilogue kernel, whose q/k window shifts of
                          a token take at most `shift_programs` programs (without e: the default,
                          `kda_epilogue_programs`); x: `evict_state=True` (the state's loads and
                          stores evicted first from L2)
  us / %copy              microseconds per call, and the state bytes (read + written, 2 * N * H *
                          D * D * 4 B) per second over the device's copy bandwidth (an eager
                          `copy_` of --copy-gib GiB measured in the same run, read + write bytes)
  ep                      V-split only: microseconds of the epilogue kernel alone, the mean of its
                          launches' device times (torch profiler) over eager calls on the same
                          rotating slots
  best, heuristic         the fastest variant, and what `kda_decode_config` picks (its time and
                          how much slower than the best it is)

Each call of the captured graph works on its own state slots, rotating through enough slots that
the states one replay touches (96 MiB or more) do not stay in the H200's 50 MiB L2 between calls,
as in a real decode step, where every other layer's traffic passes through L2 in between.

Comparison (default launch) at --compare-batches, as this benchmark measured it before the sweep:

  unfused  conv-state update, gates (torch ops), fla-core `fused_recurrent_kda`, fla-core
           `FusedRMSNormGated` (sigmoid), then `per_token_fp8_quant`
  fused    `fused_kda_decode` with its gated-RMSNorm epilogue, then `per_token_fp8_quant`
           (the layer's already-normed PTPC path)

timed as CUDA-graph replay (what a decode step pays) on one set of slots, with the kernels per
layer counted by the torch profiler over one eager call. Prints tables; `--csv` writes the sweep.

    python benchmarks/kernels/benchmark_kda_decode.py --csv kda_decode.csv

The epilogue's layouts at Kimi-Linear's engine call (a row per shift-program count):

    python benchmarks/kernels/benchmark_kda_decode.py --shapes kimi-linear --quantize \
        --batches 1 8 64 256 --no-compare \
        --variants v64w4e1 v64w4e2 v64w4e4 v64w4e8 v64w4e16 v64w4e64 v16w4e8 v16w4e64

The gate projections (`--gate-proj`, at --batches, default launch, rotating cold states and
weights as the sweep does): the layer's decode with `f_b_proj` and `g_b_proj` run as linears first
(unfused: plain bf16 `ColumnParallelLinear`s, i.e. the Triton GEMV up to `BF16_GEMV_MAX_M` rows
and cuBLAS above, then `fused_kda_decode`) against the kernel computing them (fused: `raw_g` and
`gate` as `LowRankProj`), us per call and kernels per call; `default` says which one
`kda_decode_config` picks (`GATE_PROJ_MAX_BATCH`):

    python benchmarks/kernels/benchmark_kda_decode.py --gate-proj --shapes kimi-linear --quantize \
        --batches 1 2 4 8 16 32 64 128 256

`--sweep-gate-proj` runs the variant sweep with the gate projections in the kernel for every
variant and for the heuristic (the engine's call up to `GATE_PROJ_MAX_BATCH` sequences, where each
of a head's D / block_v programs recomputes its raw_g), each call on its own cold weights:

    python benchmarks/kernels/benchmark_kda_decode.py --sweep-gate-proj --shapes kimi-linear \
        --quantize --batches 1 2 4 --no-compare --variants v16w4 v16w8 v32w4 v32w8 v64w4

`--dry-run` checks three variants (v32w4 single, v16w2 and v8w1e1 split, at D = 32) once against the
torch reference at a tiny shape, untimed (with `--gate-proj` or `--sweep-gate-proj`: fused and
unfused gate projections, v32w4 and v8w1, bit for bit); without a GPU run it under the Triton
interpreter: TRITON_INTERPRET=1 python ... --dry-run
"""

import argparse
import itertools
import re
import sys

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

from vllm.model_executor.layers.linear import ColumnParallelLinear
from vllm.models.kimi_k3.amd.ops.causal_conv1d import causal_conv1d_decode
from vllm.models.kimi_k3.amd.ops.fused_kda_decode import (
    KdaDecodeConfig,
    LowRankProj,
    fused_kda_decode,
    fused_kda_decode_ref,
    kda_decode_config,
)
from vllm.models.kimi_k3.amd.ops.fused_kda_decode_config import GATE_PROJ_MAX_BATCH
from vllm.models.kimi_k3.amd.ops.kda_gate import kda_gate
from vllm.models.kimi_k3.amd.ops.rmsnorm_gated_fp8_per_token import per_token_fp8_quant
from vllm.triton_utils import use_triton
from vllm.utils.cli import positive_int, run_main

SHAPES = {"kimi-k3-tp8": 12, "kimi-linear": 32}
BATCHES = [1, 4, 16, 64, 128, 256]
HEAD_DIM, WIDTH = 128, 4
# (block_v, num_warps) at D = 128. Registers a thread on sm_90 (ptxas, Triton 3.6 / 3.9) and so
# the programs an SM holds: v128w8 168/128 (1-2), v128w16 99/85 (1), v64w4 127 (4), v64w8 ~94
# (2), v32w2 ~127 (8), v32w4 72/77 (6-7), v32w8 ~62 (4), v16w2 ~79 (12), v16w4 56 (9),
# v8w1 ~75 (26), v8w2 56 (18).
VARIANTS = [(128, 8), (128, 16), (64, 4), (64, 8), (32, 2), (32, 4), (32, 8), (16, 2), (16, 4),
            (8, 1), (8, 2)]  # fmt: skip
# State traffic (read + write) of one replay of the sweep's graph, at most 128 slot sets: the
# states touched are 96 MiB or more, against the H200's 50 MiB L2.
ROTATE_BYTES = 256 * 2**20


def make_step(batch: int, heads: int, lower_bound: float | None, device: str = "cuda",
              head_dim: int = HEAD_DIM, slots: int | None = None):  # fmt: skip
    """One decode step's inputs; `slots` state slots in the pools (default: one per sequence)."""
    d, proj = head_dim, heads * head_dim
    slots = slots or batch
    dev = dict(device=device)
    projected = torch.randn(batch, 4 * proj + d + heads, dtype=torch.bfloat16, **dev)
    return dict(
        mixed_qkv=projected[:, : 3 * proj],
        conv_weight=torch.randn(3 * proj, WIDTH, **dev) * 0.5,
        conv_state=torch.randn(slots, 3 * proj, WIDTH - 1, dtype=torch.bfloat16, **dev),
        raw_g=torch.randn(batch, proj, dtype=torch.bfloat16, **dev),
        A_log=torch.log(torch.rand(heads, **dev) * 15 + 1),
        dt_bias=torch.randn(proj, **dev) * 0.5,
        lower_bound=lower_bound,
        b=projected[:, -heads:],
        ssm_state=torch.randn(slots, heads, d, d, **dev) * 0.1,
        slots=torch.arange(batch, **dev),
        gate=projected[:, 3 * proj : 4 * proj].view(batch, heads, d),
        norm_weight=torch.ones(d, dtype=torch.bfloat16, **dev),
    )


def gate_proj_inputs(batch: int, heads: int, device: str = "cuda", head_dim: int = HEAD_DIM):
    """f_a and g_a (column views of one buffer, as of the in_proj output) and the plain bf16
    f_b_proj / g_b_proj linears of rank R = head_dim (Kimi-Linear's). Dyadic values (a in 1/8
    steps within [-1, 1], weights in 2^-11 steps within [-1/8, 1/8]): every partial sum of the
    R-term dots is exact in fp32, so both forms round the same sums (the dry run's bit check)."""
    rank, proj = head_dim, heads * head_dim
    a = (torch.randint(-8, 9, (batch, 2 * rank + 8), device=device) / 8).to(torch.bfloat16)
    inputs = dict(f_a=a[:, :rank], g_a=a[:, rank : 2 * rank])
    for key in ("f_b_proj", "g_b_proj"):
        linear = ColumnParallelLinear(rank, proj, bias=False, params_dtype=torch.bfloat16)
        inputs[key] = linear.to(device)
        with torch.no_grad():
            linear.weight.copy_(torch.randint(-256, 257, (proj, rank), device=device) / 2048)
    return inputs


def decode_with_gate_proj(step, inputs, fuse: bool, config: KdaDecodeConfig, quantize: bool):
    """The layer's decode call with the gate projections as linears first, or (`fuse`) in it."""
    n, heads = step["b"].shape
    f_b, g_b = inputs["f_b_proj"], inputs["g_b_proj"]
    if fuse:
        raw_g = LowRankProj(inputs["f_a"], f_b.weight)
        gate = LowRankProj(inputs["g_a"], g_b.weight)
    else:
        raw_g = f_b(inputs["f_a"])[0]
        gate = g_b(inputs["g_a"])[0].view(n, heads, -1)
    step = dict(step, raw_g=raw_g, gate=gate)
    return fused_kda_decode(**step, config=config, quantize=quantize)


def unfused(step, norm):
    from fla.ops.kda import fused_recurrent_kda

    n, heads = step["b"].shape
    d = HEAD_DIM
    conv = causal_conv1d_decode(
        step["mixed_qkv"], step["conv_weight"], step["conv_state"], step["slots"]
    )
    q, k, v = (t.reshape(1, n, heads, d) for t in conv.split(heads * d, dim=-1))
    g = kda_gate(step["raw_g"], step["A_log"], step["dt_bias"], step["lower_bound"])
    beta = torch.sigmoid(step["b"].float())
    cu = torch.arange(n + 1, device="cuda")
    o, final = fused_recurrent_kda(
        q, k, v, g.unsqueeze(0), beta.unsqueeze(0), initial_state=step["ssm_state"],
        output_final_state=True, use_qk_l2norm_in_kernel=True, cu_seqlens=cu,
    )  # fmt: skip
    step["ssm_state"].copy_(final)
    y = norm(o.squeeze(0), step["gate"])
    return per_token_fp8_quant(y.reshape(n, heads * d))


def fused(step):
    core = fused_kda_decode(**step)
    return per_token_fp8_quant(core.reshape(core.shape[0], -1))


def count_kernels(fn) -> int:
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    return sum(1 for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA)


def kernel_us(fn, calls: int, kernel: str) -> float:
    """Mean device microseconds of the launches of `kernel` over `calls` eager calls of `fn`
    (the profiler's kernel records: launch gaps and the other kernels are not counted)."""
    fn()  # compiled before the profile
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
    times = [
        e.time_range.elapsed_us()
        for e in prof.events()
        if e.device_type == torch.autograd.DeviceType.CUDA and kernel in e.name
    ]
    return sum(times) / len(times) if times else float("nan")


def name(config: KdaDecodeConfig) -> str:
    shifts = "" if config.shift_programs is None else f"e{config.shift_programs}"
    return f"v{config.block_v}w{config.num_warps}{shifts}{'x' if config.evict_state else ''}"


def cell(row: dict[str, object], key: str) -> str:
    text = f"{row[f'{key}_us']:.1f}({row[f'{key}_pct_copy']:.0f}%)"
    if f"{key}_epilogue_us" in row:
        text += f" ep {row[f'{key}_epilogue_us']:.1f}"
    return text


def parse_variant(text: str) -> KdaDecodeConfig:
    match = re.fullmatch(r"v(\d+)w(\d+)(?:e(\d+))?(x?)", text)
    if match is None:
        raise ValueError(text)
    block_v, warps, shifts, evict = match.groups()
    shifts = None if shifts is None else int(shifts)
    return KdaDecodeConfig(int(block_v), int(warps), shifts, evict_state=bool(evict))


def sweep(shape: str, batch: int, args, copy: float, sms: int, variants) -> dict[str, object]:
    heads = SHAPES[shape]
    per_call = 2 * batch * heads * HEAD_DIM * HEAD_DIM * 4  # state read + written
    # The pool holds `blocks` disjoint slot sets; consecutive calls take consecutive sets, so a
    # call reads states that the calls before it (>= ROTATE_BYTES of traffic) evicted from L2.
    blocks = max(1, min(-(-ROTATE_BYTES // per_call), 128))
    calls = max(args.graph_calls, blocks)
    step = make_step(batch, heads, args.lower_bound, slots=blocks * batch)
    slot_sets = [torch.arange(batch, device="cuda") + batch * i for i in range(blocks)]
    # With --sweep-gate-proj each slot set has its own f_b / g_b weights too (cold in L2).
    gates = [gate_proj_inputs(batch, heads) if args.sweep_gate_proj else None for _ in slot_sets]
    quantize = args.quantize
    row = dict(shape=shape, batch=batch)

    def caller(config: KdaDecodeConfig):
        sets = itertools.cycle(zip(slot_sets, gates, strict=True))

        def call():
            slots, inputs = next(sets)
            at = dict(step, slots=slots)
            if inputs is None:
                return fused_kda_decode(**at, config=config, quantize=quantize)
            return decode_with_gate_proj(at, inputs, True, config, quantize)

        return call

    def timed(config: KdaDecodeConfig) -> float:
        us = time_graph(caller(config), calls, reps=args.reps)
        key = name(config)
        row[f"{key}_us"] = round(us, 2)
        row[f"{key}_pct_copy"] = round(100 * per_call / us / 1e3 / copy, 1)
        if config.block_v < HEAD_DIM:
            epilogue = kernel_us(caller(config), calls, "_kda_decode_epilogue_kernel")
            row[f"{key}_epilogue_us"] = round(epilogue, 2)
        return us

    times = {name(config): timed(config) for config in variants}
    best = min(times, key=times.get)
    default = kda_decode_config(batch, heads, HEAD_DIM, sms)
    chosen = name(default)
    row.update(best=best, heuristic=chosen, state_mib=round(per_call / 2**20, 1))
    if chosen not in times:  # a heuristic outside the swept grid: time it too
        times[chosen] = timed(default)
    row["heuristic_over_best"] = round(times[chosen] / times[best], 3)
    return row


def compare(shape: str, batch: int, args, norm) -> dict[str, object]:
    step = make_step(batch, SHAPES[shape], args.lower_bound)
    row = dict(shape=shape, batch=batch)
    providers = {"fused": lambda s=step: fused(s)}
    if norm is not None:
        providers["unfused"] = lambda s=step: unfused(s, norm)
    for key, fn in providers.items():
        fn()
        row[f"{key}_kernels"] = count_kernels(fn)
        row[f"{key}_us"] = round(time_graph(fn, args.graph_calls, reps=args.reps), 3)
    return row


def gate_proj(shape: str, batch: int, args, sms: int) -> dict[str, object]:
    heads = SHAPES[shape]
    per_call = 2 * batch * heads * HEAD_DIM * HEAD_DIM * 4  # state read + written
    # As in `sweep`: each call on its own slots, and its own f_b / g_b weights (2 MB at
    # Kimi-Linear's size), cold in L2 as in a step where all other layers run in between.
    blocks = max(1, min(-(-ROTATE_BYTES // per_call), 128))
    calls = max(args.graph_calls, blocks)
    step = make_step(batch, heads, args.lower_bound, slots=blocks * batch)
    sets = [
        (torch.arange(batch, device="cuda") + batch * i, gate_proj_inputs(batch, heads))
        for i in range(blocks)
    ]
    config = kda_decode_config(batch, heads, HEAD_DIM, sms)
    row = dict(shape=shape, batch=batch, launch=name(config), default_gate_proj=config.gate_proj)
    for key, fuse in (("unfused", False), ("fused", True)):
        rotation = itertools.cycle(sets)

        def call(fuse=fuse, rotation=rotation):
            slots, inputs = next(rotation)
            return decode_with_gate_proj(dict(step, slots=slots), inputs, fuse, config,
                                         args.quantize)  # fmt: skip

        row[f"{key}_kernels"] = count_kernels(call)
        row[f"{key}_us"] = round(time_graph(call, calls, reps=args.reps), 2)
    row["speedup"] = round(row["unfused_us"] / row["fused_us"], 3)
    return row


def dry_run_gate_proj(device: str) -> int:
    """Both gate-projection forms, single (v32w4) and V-split (v8w1), bit for bit."""
    d, heads, n, same = 32, 2, 3, True
    variants = [KdaDecodeConfig(32, 4), KdaDecodeConfig(8, 1)]
    for config in variants:
        step = make_step(n, heads, -5.0, device=device, head_dim=d, slots=4)
        inputs = gate_proj_inputs(n, heads, device, head_dim=d)
        results = []
        for fuse in (False, True):
            states = {k: step[k].clone() for k in ("conv_state", "ssm_state")}
            out = decode_with_gate_proj(dict(step, **states), inputs, fuse, config, False)
            results.append((out, *states.values()))
        same &= all(torch.equal(a, b) for a, b in zip(*results, strict=True))
    path = "Triton" if use_triton(torch.device(device)) else "the torch reference"
    print(
        f"dry run --gate-proj on {device} via {path}: {' '.join(map(name, variants))} at H = "
        f"{heads}, D = R = {d}: in-kernel gate projections equal the linears' bit for bit: {same}"
    )
    return 0 if same else 1


def dry_run() -> int:
    """Every variant (scaled to D = 32) once against the reference at a tiny shape."""
    device = "cuda" if torch.cuda.is_available() else "cpu"
    d, out_err, state_err = 32, 0.0, 0.0
    variants = [KdaDecodeConfig(32, 4), KdaDecodeConfig(16, 2), KdaDecodeConfig(8, 1, 1)]
    for config in variants:
        step = make_step(3, 2, -5.0, device=device, head_dim=d, slots=4)
        ref_step = dict(step, conv_state=step["conv_state"].clone())
        ref_step["ssm_state"] = step["ssm_state"].clone()
        got = fused_kda_decode(**step, config=config).float()
        ref = fused_kda_decode_ref(**ref_step).float()
        # Relative to 1 + |ref|: normed outputs are O(1), rounded to bf16 on both sides.
        out_err = max(out_err, ((got - ref).abs() / (1 + ref.abs())).max().item())
        state_err = max(state_err, (step["ssm_state"] - ref_step["ssm_state"]).abs().max().item())
    path = "Triton" if use_triton(torch.device(device)) else "the torch reference"
    print(
        f"dry run on {device} via {path}: {' '.join(map(name, variants))} at H = 2, D = {d}: "
        f"max |diff| output {out_err:.2e} of 1 + |ref| (bf16), state {state_err:.2e} (fp32)"
    )
    return 0 if out_err <= 2**-7 and state_err < 1e-4 else 1


def run_gate_proj(args, sms: int, call: str) -> int:
    print(f"gate projections ({call}, default launch, cold state and weights): us (kernels)")
    print(f"{'shape':>12} {'B':>4} {'launch':>9} {'unfused':>12} {'fused':>12} speedup default")
    rows = []
    with torch.inference_mode():
        for shape in args.shapes:
            for batch in args.batches:
                row = gate_proj(shape, batch, args, sms)
                rows.append(row)
                write_csv(args.csv, rows)
                cells = [
                    f"{row[f'{k}_us']:.1f} ({row[f'{k}_kernels']})" for k in ("unfused", "fused")
                ]
                default = "fused" if row["default_gate_proj"] else "unfused"
                print(
                    f"{shape:>12} {batch:>4} {row['launch']:>9} {cells[0]:>12} {cells[1]:>12} "
                    f"{row['speedup']:6.2f}x {default}",
                    flush=True,
                )
                torch.cuda.empty_cache()
    return 0


def _lower_bound(text: str) -> float:
    """The gate's lower bound as a config may hold it (`linear_attn_config.gate_lower_bound`):
    in [-5, 0), so NaN and infinities too are refused."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not -5 <= value < 0:
        raise argparse.ArgumentTypeError(f"must be in [-5, 0), got {text}")
    return value


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--batches", type=positive_int, nargs="+", default=BATCHES, help="decode batch sizes"
    )
    parser.add_argument(
        "--shapes", nargs="+", default=list(SHAPES), choices=list(SHAPES), help="model shapes"
    )
    parser.add_argument(
        "--variants", nargs="+", default=[f"v{b}w{w}" for b, w in VARIANTS],
        help="launch variants to sweep, as v{block_v}w{num_warps}[e{shift_programs}]",
    )  # fmt: skip
    parser.add_argument(
        "--quantize", action="store_true",
        help="sweep the engine's PTPC call (quantize=True: FP8 codes from the epilogue)",
    )  # fmt: skip
    parser.add_argument(
        "--lower-bound", type=_lower_bound, default=-5.0, help="gate lower bound (K3), in [-5, 0)"
    )
    parser.add_argument(
        "--graph-calls", type=positive_int, default=20, help="calls per captured graph"
    )
    parser.add_argument("--reps", type=positive_int, default=20, help="graph replays per timing")
    parser.add_argument(
        "--compare-batches", type=positive_int, nargs="+", default=[1, 64, 256],
        help="batch sizes of the fused/unfused comparison",
    )  # fmt: skip
    parser.add_argument(
        "--no-unfused", action="store_true", help="skip the fla-core unfused comparison"
    )
    parser.add_argument("--no-compare", action="store_true", help="the variant sweep only")
    parser.add_argument(
        "--gate-proj", action="store_true",
        help="instead of the sweep: f_b_proj / g_b_proj as linears vs in the kernel, per batch",
    )  # fmt: skip
    parser.add_argument(
        "--sweep-gate-proj", action="store_true",
        help="the sweep with the gate projections computed in the kernel (LowRankProj), as the "
        f"engine calls it up to {GATE_PROJ_MAX_BATCH} sequences; %%copy still counts only the "
        "state bytes, not the f_b / g_b weights the kernel reads beside them",
    )  # fmt: skip
    add_common_args(
        parser, csv="write the variant sweep (or --gate-proj) to this CSV file",
        dry_run="three variants once, checked, untimed (CPU too)",
    )  # fmt: skip
    args = parser.parse_args(argv)
    if args.gate_proj and args.sweep_gate_proj:
        parser.error("--gate-proj replaces the sweep that --sweep-gate-proj changes: give one")
    if args.dry_run:
        note_dry_run_ignores(parser, args, used=("gate_proj", "sweep_gate_proj"))
        round_like_the_gpu_if_interpreting()
    if args.dry_run and (args.gate_proj or args.sweep_gate_proj):
        return dry_run_gate_proj("cuda" if torch.cuda.is_available() else "cpu")
    if args.dry_run:
        return dry_run()
    if args.sweep_gate_proj and max(args.batches) > GATE_PROJ_MAX_BATCH:
        parser.error(
            f"--sweep-gate-proj times the engine's call up to {GATE_PROJ_MAX_BATCH} sequences "
            "(above it the layer runs the projections as linears first): give --batches up to "
            f"{GATE_PROJ_MAX_BATCH}"
        )
    require_gpu(parser, gpu="CUDA or ROCm GPU")
    try:
        variants = [parse_variant(v) for v in args.variants]
    except ValueError:
        parser.error("--variants are v{block_v}w{num_warps}[e{shift_programs}], e.g. v64w4e8")

    sms = torch.cuda.get_device_properties(0).multi_processor_count
    copy = print_copy_gbps(args.copy_gib, f", {sms} SMs")
    call = "quantize=True" if args.quantize else "norm epilogue"
    if args.gate_proj:
        return run_gate_proj(args, sms, call)
    if args.sweep_gate_proj:
        call += ", gate projections in the kernel"
    print(f"variant sweep (op alone, {call}, cold state): us (% of copy) [ep epilogue us]")
    width = 24
    header = " ".join(f"{name(c):>{width}}" for c in variants)
    print(f"{'shape':>12} {'B':>4} {header}  best / heuristic")
    rows = []
    with torch.inference_mode():
        for shape in args.shapes:
            for batch in args.batches:
                row = sweep(shape, batch, args, copy, sms, variants)
                rows.append(row)
                write_csv(args.csv, rows)  # after every row: an interrupted run keeps its rows
                cells = " ".join(f"{cell(row, name(c)):>{width}}" for c in variants)
                print(
                    f"{shape:>12} {batch:>4} {cells}  {row['best']} / {row['heuristic']} "
                    f"{cell(row, row['heuristic'])} ({row['heuristic_over_best']:.2f}x best)",
                    flush=True,
                )
                torch.cuda.empty_cache()
        if args.no_compare:
            return 0

        norm = None
        if not args.no_unfused:
            from fla.modules import FusedRMSNormGated

            norm = FusedRMSNormGated(HEAD_DIM, eps=1e-5, activation="sigmoid")
            norm = norm.to("cuda", torch.bfloat16)
        print("comparison (default launch, + per_token_fp8_quant, one set of slots)")
        for shape in args.shapes:
            for batch in args.compare_batches:
                row = compare(shape, batch, args, norm)
                line = f"{shape:>12} B={batch:>4} fused {row['fused_us']:7.2f} us "
                line += f"({row['fused_kernels']} kernels)"
                if norm is not None:
                    line += (
                        f"  unfused {row['unfused_us']:7.2f} us ({row['unfused_kernels']} "
                        f"kernels)  {row['unfused_us'] / row['fused_us']:.2f}x"
                    )
                print(line, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(run_main(main))
