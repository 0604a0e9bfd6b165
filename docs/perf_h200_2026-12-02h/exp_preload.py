"""Experiment: does an FP8 o_proj GEMV at M = 1 gain from loading its weight slice before
griddepcontrol.wait, when the kernel before it is a short latency-bound one (the engine's order:
quant / KDA epilogue -> o_proj GEMV)?

Graph replay of 16 (quant, GEMV) pairs on rotating weights; us per pair, and per GEMV alone
back to back. Variants of a one-tile GEMV ([BLOCK_N, K] weight tile, no K loop) against the
production gemv_fp8.
"""

import sys

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

sys.path.insert(0, "benchmarks/kernels")
from kernel_bench import copy_gbps, time_graph  # noqa: E402

from vllm.model_executor.kernels.linear.gemv import gemv, gemv_fp8  # noqa: E402
from vllm.model_executor.kernels.linear.gemv_config import GemvConfig  # noqa: E402
from vllm.model_executor.layers.quantization.utils.fp8_per_token import (  # noqa: E402
    per_token_fp8_quant,
)


@triton.jit
def _tile_gemv(a_ptr, as_ptr, w_ptr, ws_ptr, out_ptr, stride_wn,
               K: tl.constexpr, BLOCK_N: tl.constexpr, PRE: tl.constexpr, PDL: tl.constexpr,
               SIGNAL: tl.constexpr):  # fmt: skip
    n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    k = tl.arange(0, K)
    ptrs = w_ptr + n.to(tl.int64)[:, None] * stride_wn + k[None, :]
    if PRE:
        w = tl.load(ptrs)
        if PDL:
            gdc_wait()
            if SIGNAL:
                gdc_launch_dependents()
    else:
        if PDL:
            gdc_wait()
            if SIGNAL:
                gdc_launch_dependents()
        w = tl.load(ptrs)
    x = tl.load(a_ptr + k).to(tl.float32)
    acc = tl.sum(w.to(tl.float32) * x[None, :], axis=1)
    acc = acc * tl.load(as_ptr) * tl.load(ws_ptr + n)
    tl.store(out_ptr + n, acc.to(out_ptr.dtype.element_ty))


def main() -> None:
    torch.manual_seed(0)
    dev = "cuda"
    n, k, copies = 2304, 4096, 16
    fp8 = torch.float8_e4m3fn
    ws = [(torch.randn(n, k, device=dev) * 0.05).to(fp8) for _ in range(copies)]
    wsc = [torch.rand(n, device=dev) * 0.01 + 0.001 for _ in range(copies)]
    xs = [torch.randn(1, k, device=dev, dtype=torch.bfloat16) for _ in range(copies)]
    a_buf = torch.empty(1, k, device=dev, dtype=fp8)
    s_buf = torch.empty(1, 1, device=dev, dtype=torch.float32)
    out = torch.empty(1, n, device=dev, dtype=torch.bfloat16)
    print(f"copy {copy_gbps(2.0):.0f} GB/s", flush=True)

    # Correctness of the tile kernel against the production GEMV.
    per_token_fp8_quant(xs[0], out=a_buf, scale_out=s_buf)
    ref = gemv_fp8(a_buf, s_buf, ws[0], wsc[0])
    for bn, warps, pre in ((2, 4, True), (4, 4, False)):
        _tile_gemv[(n // bn,)](
            a_buf,
            s_buf,
            ws[0],
            wsc[0],
            out,
            ws[0].stride(0),
            K=k,
            BLOCK_N=bn,
            PRE=pre,
            PDL=False,
            SIGNAL=False,
            num_warps=warps,
        )
        torch.cuda.synchronize()
        err = (out.float() - ref.float()).abs().max().item()
        print(f"tile bn={bn} pre={pre}: max |diff| vs gemv_fp8 {err:.3g}", flush=True)

    state = {"i": 0}

    def nxt() -> int:
        i = state["i"] % copies
        state["i"] += 1
        return i

    def prod(i: int) -> None:
        gemv_fp8(a_buf, s_buf, ws[i], wsc[i], out_dtype=torch.bfloat16)

    def tile(bn: int, warps: int, pre: bool, pdl: bool, signal: bool = True):
        opts = {"launch_pdl": True} if pdl else {}

        def run(i: int) -> None:
            _tile_gemv[(n // bn,)](a_buf, s_buf, ws[i], wsc[i], out, ws[i].stride(0), K=k,
                                   BLOCK_N=bn, PRE=pre, PDL=pdl, SIGNAL=signal,
                                   num_warps=warps, **opts)  # fmt: skip

        return run

    variants = {"prod": prod}

    def prod_cfg(bn: int, bk: int, warps: int, stages: int):
        cfg = GemvConfig(bn, bk, warps, split_k=1, num_stages=stages)

        def run(i: int) -> None:
            gemv_fp8(a_buf, s_buf, ws[i], wsc[i], out_dtype=torch.bfloat16, config=cfg)

        return run

    for bn, bk, warps, stages in (
        (2, 2048, 4, 3),
        (2, 2048, 4, 1),
        (2, 4096, 4, 1),
        (2, 4096, 4, 2),
        (4, 4096, 4, 1),
        (1, 4096, 2, 1),
        (2, 4096, 2, 1),
        (4, 4096, 8, 1),
        (2, 2048, 4, 2),
    ):
        variants[f"cfg{bn},{bk},{warps},1,{stages}"] = prod_cfg(bn, bk, warps, stages)
    for bn in (1, 2, 4, 8):
        for warps in (2, 4, 8):
            if bn * k // (32 * warps) > 256:  # > 256 B of fp8 per thread
                continue
            variants[f"tile{bn}w{warps}"] = tile(bn, warps, False, True)
            variants[f"tile{bn}w{warps}pre"] = tile(bn, warps, True, True)
    variants["tile2w4nopdl"] = tile(2, 4, False, False)
    variants["tile2w4pre_nosig"] = tile(2, 4, True, True, False)
    variants["tile2w4_nosig"] = tile(2, 4, False, True, False)

    def quant_only() -> None:
        per_token_fp8_quant(xs[nxt()], out=a_buf, scale_out=s_buf)

    t_quant = time_graph(quant_only, copies, reps=100)
    print(f"quant alone: {t_quant:.2f} us", flush=True)
    print(f"{'variant':>20} {'gemv alone':>11} {'quant+gemv':>11} {'pair-quant':>11}")
    for name, fn in variants.items():

        def alone(fn=fn) -> None:
            fn(nxt())

        def pair(fn=fn) -> None:
            i = nxt()
            per_token_fp8_quant(xs[i], out=a_buf, scale_out=s_buf)
            fn(i)

        try:
            ta = min(time_graph(alone, copies, reps=60) for _ in range(3))
            tp = min(time_graph(pair, copies, reps=60) for _ in range(3))
        except Exception as exc:  # a variant that does not fit is reported, not fatal
            print(f"{name:>20} failed: {type(exc).__name__}: {exc}"[:300], flush=True)
            continue
        print(f"{name:>20} {ta:11.2f} {tp:11.2f} {tp - t_quant:11.2f}", flush=True)


def bf16_main() -> None:
    """The bf16 o_proj GEMV (M = 1, 2) by config, back to back."""
    dev, n, k, copies = "cuda", 2304, 4096, 16
    ws = [torch.randn(n, k, device=dev, dtype=torch.bfloat16) * 0.05 for _ in range(copies)]
    state = {"i": 0}
    for m in (1, 2):
        x = torch.randn(m, k, device=dev, dtype=torch.bfloat16)
        for cfg in (
            None,
            GemvConfig(2, 1024, 4, 1, num_stages=1),
            GemvConfig(2, 4096, 4, 1, num_stages=1),
            GemvConfig(1, 4096, 4, 1, num_stages=1),
            GemvConfig(2, 2048, 4, 1, num_stages=1),
            GemvConfig(2, 4096, 8, 1, num_stages=1),
        ):

            def run(cfg=cfg, x=x) -> None:
                i = state["i"] % copies
                state["i"] += 1
                gemv(x, ws[i], config=cfg)

            t = min(time_graph(run, copies, reps=60) for _ in range(3))
            label = (
                "default"
                if cfg is None
                else f"{cfg.block_n},{cfg.block_k},{cfg.num_warps},1,{cfg.num_stages}"
            )
            print(f"bf16 o_proj M={m} {label:>16} {t:7.2f} us", flush=True)


def fp8_m2_main() -> None:
    """The FP8 o_proj GEMV at M = 2 by config, back to back."""
    dev, n, k, copies = "cuda", 2304, 4096, 16
    fp8 = torch.float8_e4m3fn
    ws = [(torch.randn(n, k, device=dev) * 0.05).to(fp8) for _ in range(copies)]
    wsc = [torch.rand(n, device=dev) * 0.01 + 0.001 for _ in range(copies)]
    a = (torch.randn(2, k, device=dev) * 0.05).to(fp8)
    s = torch.rand(2, 1, device=dev)
    state = {"i": 0}
    for cfg in (
        None,
        GemvConfig(2, 4096, 4, 1, num_stages=1),
        GemvConfig(2, 2048, 4, 1, num_stages=1),
        GemvConfig(4, 4096, 4, 1, num_stages=1),
        GemvConfig(4, 4096, 8, 1, num_stages=1),
    ):

        def run(cfg=cfg) -> None:
            i = state["i"] % copies
            state["i"] += 1
            gemv_fp8(a, s, ws[i], wsc[i], out_dtype=torch.bfloat16, config=cfg)

        t = min(time_graph(run, copies, reps=60) for _ in range(3))
        label = (
            "default"
            if cfg is None
            else f"{cfg.block_n},{cfg.block_k},{cfg.num_warps},1,{cfg.num_stages}"
        )
        print(f"fp8 o_proj M=2 {label:>16} {t:7.2f} us", flush=True)


if __name__ == "__main__":
    main()
    fp8_m2_main()
    bf16_main()
