"""Benchmark the MoE router: `grouped_topk_triton` (one kernel) against `grouped_topk_ref` (the
torch reference: ~12 launches, two `topk` sorts) on Kimi-Linear-48B's router.

Router: 256 experts, top-8, sigmoid, score-correction bias, renormalised, scaling 2.446, one
expert group (--groups / --topk-group for a grouped variant); fp32 logits of T tokens.

Both are timed as CUDA-graph replay of --graph-calls back-to-back calls (what a decode step pays).
Bytes are the logits and bias read plus the weights and ids written; the bandwidth is reported
against an eager `copy_` of --copy-gib GiB measured in the same run after a warm-up. At decode
sizes the router moves a few KB, so the microseconds (launch-bound) are the number to read; the
percentage shows how far from streaming it is. Before timing, each size checks that the kernel
and the reference choose the same experts.

    python benchmarks/kernels/benchmark_router.py --csv router.csv
    python benchmarks/kernels/benchmark_router.py --warps 1 2 4 --tokens 64 256
    TRITON_INTERPRET=1 python benchmarks/kernels/benchmark_router.py --dry-run   # tiny, CPU

--logits times the router's logits instead: `router_logits` (the fp32-weight GEMV of gemv.py)
against `F.linear(x.float(), w)` (what KimiMoE ran before) for bf16 x `[T, 2304]` and the fp32
gate `[256, 2304]`. A decode step runs one per MoE layer, each with its own 2.4 MB gate, so the
graph replays --layers calls over as many distinct gates (26: 61 MB, beyond the H200's L2): the
weight comes from HBM as it does in the model. Bytes are the gate, x and the logits; the weight
read alone sets the floor. --logits-configs adds a sweep of GEMV configs (the syntax of
benchmark_gemv.py; `default` is gemv_config.default_config), each checked against the fp64 bound
of the tests first; the last lines name the fastest config per T, to update
gemv_config._fp32_config.

    python benchmarks/kernels/benchmark_router.py --logits --csv logits.csv
    python benchmarks/kernels/benchmark_router.py --logits --logits-configs default \
        2,1024,4 2,512,4 1,1024,2 4,512,4 2,256,4,2 16,64,4,8,3,dot,m64 16,64,4,4,3,dot,m64 \
        32,64,4,4,3,dot,m64 16,32,4,8,3,dot,m32 16,128,4,4,3,dot,m16 16,64,8,2,3,dot,m64
    python benchmarks/kernels/benchmark_router.py --logits --tokens 16 64 256 1024 8192 \
        --logits-configs default 64,64,4,a,3,dot3 64,64,4,a,3,dot3,m32 128,64,8,a,3,dot3 \
        64,32,4,a,4,dot3 64,64,4,1,3,dot3,m64

`dot3` configs split the fp32 gate into three bf16 terms for bf16 MMAs
(gemv_config.GemvConfig.bf16x3).

--fused times what KimiMoE routes a decode batch with: the two launches `router_logits` then
`grouped_topk` against `fused_router_topk` (fused_router.py, one launch), with Kimi-Linear's fused
shared expert (top-8 + 1), at T = 1, 2, 4, 8 unless --tokens says otherwise. As with --logits, the
graph replays --layers calls over as many layers, each with its own gate, bias and (fused)
semaphore, so the gates come from HBM. Each fused path is first checked on exact data (integer x,
gates of multiples of 2^-10: all logits exact) to give the two launches' ids, and their weights up
to the order of the renormalising sum.
--fused-configs adds a sweep of `FusedRouterConfig`s, `BLOCK_N,BLOCK_H,WARPS` (experts per program,
hidden chunk, warps; `default` is fused_router.default_config); the last lines compare each T's
fastest fused path with the two launches, to update fused_router.default_config and
FUSED_ROUTER_MAX_T.

    python benchmarks/kernels/benchmark_router.py --fused --csv fused.csv
    python benchmarks/kernels/benchmark_router.py --fused --fused-configs default 1,1024,4 \
        2,512,4 2,1024,2 2,1024,1 2,2048,4 4,512,4 4,1024,8 8,256,4

--fused-norm times what a MoE decoder layer runs at one token before its experts: the
post-attention residual add and RMSNorm (bf16 rows, a bf16 norm weight per layer) then the fused
router, as two launches (`fused_add_rms_norm`, `fused_router_topk`), against
`fused_norm_router_topk`, the norm in the router's launch (fused_router.py), at T = 1 unless
--tokens says otherwise, over --layers layers as --fused does. `norm + router (before)` is what
the layer ran before (the router at `default_config`, 4 warps); `norm + router[BN,BH,W]` the two
launches with the router at a fused path's config, which takes the norm kernel's warps (8 at H
2304). Each fused path is first checked to equal the latter bit for bit (h, residual, weights,
ids) on the timed data. --fused-configs sweeps the fused path's BLOCK_N,BLOCK_H at the norm's warps.

    python benchmarks/kernels/benchmark_router.py --fused-norm --csv fused_norm.csv
    python benchmarks/kernels/benchmark_router.py --fused-norm --tokens 1 2 --fused-configs \
        default 1,1024,8 4,512,8 4,1024,8 2,512,8
"""

import argparse
import functools
import itertools
import sys

import torch
import torch.nn.functional as F
from benchmark_gemv import gemv_config
from kernel_bench import (
    add_common_args,
    copy_gbps,
    note_dry_run_ignores,
    require_gpu,
    round_like_the_gpu_if_interpreting,
    time_eager,
    time_graph,
    write_csv,
)

from vllm.model_executor.kernels.linear.gemv import gemv_fp32
from vllm.model_executor.layers.fused_moe.fused_router import (
    FusedRouterConfig,
    default_norm_config,
    fused_norm_router_topk,
    fused_router_topk,
)
from vllm.model_executor.layers.fused_moe.router import (
    RoutingParams,
    grouped_topk,
    grouped_topk_ref,
    grouped_topk_triton,
    router_logits,
)
from vllm.model_executor.layers.ops.rms_norm import fused_add_rms_norm
from vllm.triton_utils import use_triton
from vllm.utils.cli import positive_int, run_main

TOKENS = [1, 8, 64, 256]
FUSED_TOKENS = [1, 2, 4, 8]
FUSED_NORM_TOKENS = [1]
KIMI_LINEAR = dict(
    experts=256, top_k=8, routed_scaling_factor=2.446, hidden=2304, layers=26, rms_norm_eps=1e-5
)


def check_logits(out: torch.Tensor, x: torch.Tensor, w: torch.Tensor, terms_per_k: int = 1) -> None:
    """The tests' bound: fp32 products summed in fp32, (K + 2) * 2^-24 * sum |x w| off exact
    (`terms_per_k` 3 for a bf16x3 config's 3 K products)."""
    xd, wd = x.double(), w.double()
    err = (out.double() - xd @ wd.t()).abs()
    if not (err <= (terms_per_k * x.shape[1] + 2) * 2**-24 * (xd.abs() @ wd.abs().t())).all():
        raise SystemExit("logits outside the fp32 accumulation bound")


def bench_logits(args, device: torch.device, tokens_list: list[int], copy: float) -> int:
    """Times the logits paths at each T (module docstring); rows go to --csv."""
    gen = torch.Generator(device=device).manual_seed(args.seed)
    experts, hidden = args.experts, args.hidden
    gates = [
        torch.randn(experts, hidden, generator=gen, device=device) * hidden**-0.5
        for _ in range(args.layers)
    ]
    paths = [
        ("F.linear", lambda x, w: F.linear(x.float(), w), 1),
        # bf16 x above a few tokens takes bf16x3 by default: its (3 K + 2) bound.
        ("router_logits", router_logits, 3),
    ]
    for label, cfg in args.logits_configs or []:
        fn = functools.partial(gemv_fp32, config=cfg)
        paths.append((f"gemv[{label}]", fn, 1 if cfg is not None and not cfg.bf16x3 else 3))
    rows, best = [], {}
    with torch.inference_mode():
        for tokens in tokens_list:
            x = torch.randn(tokens, hidden, generator=gen, device=device).to(torch.bfloat16)
            moved = gates[0].numel() * 4 + x.numel() * 2 + tokens * experts * 4
            for name, fn, terms_per_k in paths:
                check_logits(fn(x, gates[0]), x, gates[0], terms_per_k)
                layer = itertools.count()

                def call(fn=fn, x=x, layer=layer):
                    return fn(x, gates[next(layer) % len(gates)])

                us = time_and_record(
                    call, len(gates), device, args.csv, rows, copy, 28, tokens=tokens,
                    experts=experts, hidden=hidden, path=name, bytes=moved,
                )  # fmt: skip
                if name != "F.linear" and us < best.get(tokens, ("", float("inf")))[1]:
                    best[tokens] = (name, us)
    for tokens, (name, us) in best.items():
        print(f"fastest kernel path at T={tokens}: {name} ({us:.2f} us)")
    return 0


def time_and_record(
    call,
    calls: int,
    device: torch.device,
    csv: str | None,
    rows: list,
    copy: float,
    width: int,
    **row: object,
) -> float:
    """Time `call` (graph replay of `calls` calls on CUDA, else eager), append its row (`row`
    plus the timing columns) to `rows` and the CSV, print it; returns us per call."""
    graphed = device.type == "cuda"
    us = time_graph(call, calls) if graphed else time_eager(call, device)
    gbps = row["bytes"] / (us * 1e-6) / 1e9
    row.update(timing="graph" if graphed else "eager", us=round(us, 2), gbps=round(gbps, 2))
    row.update(pct_copy=round(100 * gbps / copy, 2), copy_gbps=round(copy, 1))
    rows.append(row)
    write_csv(csv, rows)
    print(
        f"T={row['tokens']:>4} {row['path']:>{width}} ({row['timing']}) {us:9.2f} us  "
        f"{row['bytes'] / 1e6:6.2f} MB  {gbps:8.1f} GB/s  {row['pct_copy']:6.2f}% of copy",
        flush=True,
    )
    return us


def fused_config(text: str) -> tuple[str, FusedRouterConfig | None]:
    """`BLOCK_N,BLOCK_H,WARPS` or `default` -> (label, config)."""
    if text == "default":
        return text, None
    try:
        values = [int(v) for v in text.split(",")]
        if len(values) != 3:
            raise ValueError(text)
        config = FusedRouterConfig(*values)
        config.check()
    except (TypeError, ValueError):
        raise argparse.ArgumentTypeError(
            f"{text!r} is not BLOCK_N,BLOCK_H,WARPS (powers of two) or 'default'"
        ) from None
    return text, config


def router_layers(
    args, device: torch.device, gen: torch.Generator
) -> tuple[RoutingParams, list, list, list]:
    """(routing params, then per layer: gates, biases, semaphores) of the --fused modes:
    Kimi-Linear's router with its fused shared expert, one gate per MoE layer."""
    experts, hidden, layers = args.experts, args.hidden, args.layers
    router = routing_params(args, num_fused_shared_experts=1)
    gates = [(torch.randn(experts, hidden, generator=gen) * hidden**-0.5).to(device)
             for _ in range(layers)]  # fmt: skip
    biases = [(torch.randn(experts, generator=gen) * 0.1).to(device) for _ in range(layers)]
    semaphores = [torch.zeros(1, dtype=torch.int32, device=device) for _ in range(layers)]
    return router, gates, biases, semaphores


def bench_fused(args, device: torch.device, tokens_list: list[int], copy: float) -> int:
    """Times the two-launch router against the fused one at each T (module docstring)."""
    gen = torch.Generator().manual_seed(args.seed)  # on the CPU: the same data on any device
    experts, hidden, layers = args.experts, args.hidden, args.layers
    router, gates, biases, semaphores = router_layers(args, device, gen)
    columns = args.top_k + 1  # weights (fp32) and ids (int64) written per token
    exact_x = torch.randint(-3, 4, (max(tokens_list), hidden), generator=gen).to(torch.bfloat16)
    exact_gate = torch.randint(-64, 65, (experts, hidden), generator=gen) * 2.0**-10
    exact_x, exact_gate = exact_x.to(device), exact_gate.to(device)

    def two_launches(x, layer):
        return grouped_topk(router_logits(x, gates[layer]), biases[layer], router)

    paths = [("two launches", None, two_launches)]
    for label, config in args.fused_configs or [("default", None)]:

        def fused(x, layer, config=config):
            return fused_router_topk(x, gates[layer], biases[layer], router,
                                     semaphore=semaphores[layer], config=config)  # fmt: skip

        paths.append((f"fused[{label}]", config, fused))
    rows, best = [], {}
    with torch.inference_mode():
        for tokens in tokens_list:
            x = torch.randn(tokens, hidden, generator=gen).to(torch.bfloat16).to(device)
            moved = gates[0].numel() * 4 + x.numel() * 2 + experts * 4 + tokens * columns * 12
            exact = grouped_topk(router_logits(exact_x[:tokens], exact_gate), biases[0], router)
            for name, config, fn in paths:
                if name != "two launches":  # the reference of the check below
                    got = fused_router_topk(exact_x[:tokens], exact_gate, biases[0], router,
                                            semaphore=semaphores[0], config=config)  # fmt: skip
                    # Same ids; weights up to the order of the renormalising sum of top_k terms,
                    # which the warps per program set: 2 (top_k - 1) 2^-24 relative at most.
                    rtol = 2 * args.top_k * 2**-24
                    if not torch.equal(got[1], exact[1]) or not torch.allclose(
                        got[0], exact[0], rtol=rtol, atol=0.0
                    ):
                        raise SystemExit(f"T={tokens} {name}: differs from the two launches")
                layer = itertools.count()

                def call(fn=fn, x=x, layer=layer):
                    return fn(x, next(layer) % layers)

                us = time_and_record(
                    call, layers, device, args.csv, rows, copy, 24, tokens=tokens,
                    experts=experts, hidden=hidden, path=name, bytes=moved,
                )  # fmt: skip
                if name == "two launches":
                    best[tokens] = [us, ("", float("inf"))]
                elif us < best[tokens][1][1]:
                    best[tokens][1] = (name, us)
    for tokens, (two_us, (name, us)) in best.items():
        print(f"T={tokens}: fastest {name} {us:.2f} us vs two launches {two_us:.2f} us "
              f"({us - two_us:+.2f} us, {us / two_us:.2f}x)")  # fmt: skip
    return 0


def bench_fused_norm(args, device: torch.device, tokens_list: list[int], copy: float) -> int:
    """Times the norm's launch then the fused router against the norm in the router's launch at
    each T (module docstring); rows go to --csv."""
    gen = torch.Generator().manual_seed(args.seed)  # on the CPU: the same data on any device
    experts, hidden, layers = args.experts, args.hidden, args.layers
    router, gates, biases, semaphores = router_layers(args, device, gen)
    norm_weights = [(1 + 0.1 * torch.randn(hidden, generator=gen)).to(torch.bfloat16).to(device)
                    for _ in range(layers)]  # fmt: skip
    eps = KIMI_LINEAR["rms_norm_eps"]
    columns = args.top_k + 1
    configs = args.fused_configs or [("default", None)]
    for label, config in configs:
        if config is not None and config.num_warps != default_norm_config(hidden).num_warps:
            raise SystemExit(
                f"--fused-norm: {label} must take the norm kernel's "
                f"{default_norm_config(hidden).num_warps} warps at H {hidden}"
            )

    def unfused(x, residual, layer, config=None):
        h, new_residual = fused_add_rms_norm(x, residual, norm_weights[layer], eps)
        weights, ids = fused_router_topk(h, gates[layer], biases[layer], router,
                                         semaphore=semaphores[layer], config=config)  # fmt: skip
        return h, new_residual, weights, ids

    baseline = "norm + router (before)"
    paths, exact_configs = [(baseline, None, unfused)], set()
    for label, config in configs:
        exact = config or default_norm_config(hidden)
        if exact not in exact_configs:
            exact_configs.add(exact)
            shape = f"{exact.block_n},{exact.block_h},{exact.num_warps}"
            paths.append((f"norm + router[{shape}]", exact,
                          functools.partial(unfused, config=exact)))  # fmt: skip

        def fused(x, residual, layer, config=config):
            return fused_norm_router_topk(
                x, residual, norm_weights[layer], eps, gates[layer], biases[layer], router,
                semaphore=semaphores[layer], config=config,
            )  # fmt: skip

        paths.append((f"fused norm+router[{label}]", exact, fused))
    rows, best = [], {}
    with torch.inference_mode():
        for tokens in tokens_list:
            x, residual = (torch.randn(tokens, hidden, generator=gen).to(torch.bfloat16).to(device)
                           for _ in range(2))  # fmt: skip
            # gate, x, residual and norm weight read; h, residual, weights and ids written
            moved = gates[0].numel() * 4 + (4 * tokens + 1) * hidden * 2 + tokens * columns * 12
            for name, config, fn in paths:
                if name.startswith("fused"):  # bit for bit the unfused launches at its config
                    got, want = fn(x, residual, 0), unfused(x, residual, 0, config)
                    if not all(torch.equal(a, b) for a, b in zip(got, want, strict=True)):
                        raise SystemExit(f"T={tokens} {name}: differs from the norm + router")
                layer = itertools.count()

                def call(fn=fn, x=x, residual=residual, layer=layer):
                    return fn(x, residual, next(layer) % layers)

                us = time_and_record(
                    call, layers, device, args.csv, rows, copy, 30, tokens=tokens,
                    experts=experts, hidden=hidden, path=name, bytes=moved,
                )  # fmt: skip
                if name == baseline:
                    best[tokens] = [us, ("", float("inf"))]
                elif name.startswith("fused") and us < best[tokens][1][1]:
                    best[tokens][1] = (name, us)
    for tokens, (two_us, (name, us)) in best.items():
        print(f"T={tokens}: fastest {name} {us:.2f} us vs {baseline} "
              f"{two_us:.2f} us ({us - two_us:+.2f} us, {us / two_us:.2f}x)")  # fmt: skip
    return 0


def routing_params(args, num_fused_shared_experts: int = 0) -> RoutingParams:
    """Kimi-Linear's router (sigmoid, renormalised, its scaling) at the command line's sizes."""
    return RoutingParams(
        args.experts, args.top_k, num_expert_group=args.groups, topk_group=args.topk_group,
        routed_scaling_factor=KIMI_LINEAR["routed_scaling_factor"],
        num_fused_shared_experts=num_fused_shared_experts,
    )  # fmt: skip


def make_inputs(tokens: int, experts: int, device: torch.device, seed: int):
    gen = torch.Generator(device=device).manual_seed(seed)
    logits = torch.randn(tokens, experts, generator=gen, device=device)
    bias = torch.randn(experts, generator=gen, device=device) * 0.1
    return logits, bias


def _warps(text: str) -> int:
    """A Triton num_warps: a power of two up to 32 (3 failed in the launch, after the reference
    had been timed)."""
    warps = positive_int(text)
    if warps > 32 or warps & (warps - 1):
        raise argparse.ArgumentTypeError(f"must be a power of two up to 32, got {warps}")
    return warps


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--tokens", type=positive_int, nargs="+",
        help=f"tokens per call (default {TOKENS}, with --fused {FUSED_TOKENS})",
    )  # fmt: skip
    parser.add_argument(
        "--experts", type=int, default=KIMI_LINEAR["experts"], help="routed experts (E)"
    )
    parser.add_argument(
        "--top-k", type=int, default=KIMI_LINEAR["top_k"], help="experts chosen per token"
    )
    parser.add_argument("--groups", type=int, default=1, help="num_expert_group")
    parser.add_argument(
        "--topk-group", type=positive_int, default=1, help="groups kept per token (topk_group)"
    )
    parser.add_argument(
        "--warps",
        type=_warps,
        nargs="+",
        help="time the kernel at each num_warps (default: its own)",
    )
    parser.add_argument(
        "--graph-calls", type=positive_int, default=20, help="calls per captured graph"
    )
    # One of the three timings at a time: the others' flags were dropped silently.
    what = parser.add_mutually_exclusive_group()
    what.add_argument(
        "--logits", action="store_true", help="time the router logits (module docstring)"
    )
    parser.add_argument(
        "--logits-configs", nargs="+", type=gemv_config,
        metavar="BN,BK,W[,S[,ST[,dot|dot3]]][,mBM]",
        help="with --logits: also time gemv_fp32 at each config (a sweep)",
    )  # fmt: skip
    what.add_argument(
        "--fused", action="store_true", help="time the fused router (module docstring)"
    )
    what.add_argument(
        "--fused-norm", action="store_true",
        help="time the norm in the fused router's launch (module docstring)",
    )  # fmt: skip
    parser.add_argument(
        "--fused-configs", nargs="+", type=fused_config, metavar="BN,BH,W",
        help="with --fused / --fused-norm: time the fused op at each config (a sweep)",
    )  # fmt: skip
    parser.add_argument(
        "--hidden",
        type=positive_int,
        default=KIMI_LINEAR["hidden"],
        help="--logits / --fused / --fused-norm: H",
    )
    parser.add_argument(
        "--layers", type=positive_int, default=KIMI_LINEAR["layers"],
        help="--logits / --fused / --fused-norm: distinct gates per graph (one per MoE layer)",
    )  # fmt: skip
    parser.add_argument("--seed", type=int, default=0, help="seed of the logits and weights")
    add_common_args(
        parser,
        dry_run="32 experts, top-4, on the CPU (kernel under TRITON_INTERPRET=1), eager timing: "
        "checks the script, measures nothing useful",
    )
    args = parser.parse_args(argv)
    if args.dry_run:
        ignored = ("tokens", "experts", "top_k", "hidden", "layers", "copy_gib", "graph_calls")
        note_dry_run_ignores(parser, args, ignored=ignored)
        round_like_the_gpu_if_interpreting()
        device, tokens_list, copy_gib = torch.device("cpu"), [1, 3], 1 / 64
        args.experts, args.top_k, args.hidden, args.layers = 32, 4, 72, 2
    else:
        require_gpu(parser)
        defaults = FUSED_NORM_TOKENS if args.fused_norm else FUSED_TOKENS if args.fused else TOKENS
        tokens_list = args.tokens or defaults
        device, copy_gib = torch.device("cuda"), args.copy_gib
    if not use_triton(device):
        parser.error("the kernel runs on CPU only under TRITON_INTERPRET=1")

    try:
        router = routing_params(args)
    except ValueError as e:
        parser.error(str(e))
    impls = [("reference", grouped_topk_ref)]
    for warps in args.warps or [None]:
        name = "kernel" if warps is None else f"kernel[w{warps}]"
        impls.append((name, functools.partial(grouped_topk_triton, num_warps=warps)))

    copy = copy_gbps(copy_gib, device)
    print(f"{device.type}: eager copy_ of {copy_gib:g} GiB: {copy:.0f} GB/s", flush=True)
    if args.logits:
        return bench_logits(args, device, tokens_list, copy)
    if args.fused:
        return bench_fused(args, device, tokens_list, copy)
    if args.fused_norm:
        return bench_fused_norm(args, device, tokens_list, copy)
    rows = []
    with torch.inference_mode():
        for tokens in tokens_list:
            logits, bias = make_inputs(tokens, args.experts, device, args.seed)
            ref_w, ref_ids = grouped_topk_ref(logits, bias, router)
            moved = (logits.numel() + bias.numel()) * 4 + ref_ids.numel() * (4 + 8)
            for name, impl in impls:
                weights, ids = impl(logits, bias, router)
                if not torch.equal(ids, ref_ids):
                    raise SystemExit(f"T={tokens} {name}: expert ids differ from the reference")
                torch.testing.assert_close(weights, ref_w, rtol=8 * 2**-23, atol=0.0)

                def call(impl=impl, logits=logits, bias=bias):
                    return impl(logits, bias, router)

                graphed = device.type == "cuda"
                us = time_graph(call, args.graph_calls) if graphed else time_eager(call, device)
                gbps = moved / (us * 1e-6) / 1e9
                row = dict(tokens=tokens, experts=args.experts, top_k=args.top_k,
                           groups=args.groups, path=name, timing="graph" if graphed else "eager",
                           us=round(us, 2), bytes=moved, gbps=round(gbps, 2),
                           pct_copy=round(100 * gbps / copy, 2),
                           copy_gbps=round(copy, 1))  # fmt: skip
                rows.append(row)
                write_csv(args.csv, rows)  # after every row: an interrupted run keeps its rows
                print(
                    f"T={tokens:>4} {name:>12} ({row['timing']}) {us:9.2f} us  "
                    f"{moved / 1e3:8.1f} KB  {gbps:7.2f} GB/s  {row['pct_copy']:6.2f}% of copy",
                    flush=True,
                )
    return 0


if __name__ == "__main__":
    sys.exit(run_main(main))
