"""Probe (H200): does asking L2 for a weight on a side stream, while a latency-bound kernel runs,
make the weight's GEMV after it faster, in a CUDA graph?

Chains, 16 per graph (rotating weights, so every read comes from HBM unless prefetched):
  moe    fused norm + router at one token (26-layer gates), then the routed experts (8 routed +
         the fused shared slot); prefetch: the shared slot's w13 and w2 rows (14.2 MB)
  oproj  the same router as the latency-bound kernel before, then the FP8 o_proj GEMV
         (2304 x 4096, 9.4 MB); prefetch: that weight
Variants: plain; prefetch forked before the router and joined before the consumer; the same
joined after the consumer. Prefetch forms: `bulk` (cp.async.bulk.prefetch.L2, CHUNK bytes a
thread) and `line` (prefetch.global.L2 per 128-byte line).
"""

import statistics
import sys

import torch
import triton
import triton.language as tl

from vllm.model_executor.kernels.linear.gemv import gemv_fp8
from vllm.model_executor.layers.activation import SiluAndMul
from vllm.model_executor.layers.fused_moe.experts_triton import moe_experts_triton
from vllm.model_executor.layers.fused_moe.fused_router import fused_norm_router_topk
from vllm.model_executor.layers.fused_moe.router import RoutingParams


@triton.jit
def _bulk_kernel(ptr, nbytes, CHUNK: tl.constexpr, PER: tl.constexpr):
    offs = (tl.program_id(0) * PER + tl.arange(0, PER)).to(tl.int64) * CHUNK
    last = ((nbytes - 1) // CHUNK) * CHUNK
    offs = tl.minimum(offs, last)
    size = tl.minimum(nbytes - offs, CHUNK).to(tl.int32)
    tl.inline_asm_elementwise(
        "cp.async.bulk.prefetch.L2.global [$1], $2;", "=r,l,r", [ptr + offs, size],
        dtype=tl.int32, is_pure=False, pack=1,
    )  # fmt: skip


@triton.jit
def _line_kernel(ptr, nbytes, PER: tl.constexpr):
    offs = (tl.program_id(0) * PER + tl.arange(0, PER)).to(tl.int64) * 128
    offs = tl.minimum(offs, nbytes - 1)
    tl.inline_asm_elementwise(
        "prefetch.global.L2 [$1];", "=r,l", [ptr + offs], dtype=tl.int32, is_pure=False, pack=1
    )


def prefetch(t: torch.Tensor, form: str) -> None:
    flat = t.view(torch.uint8).reshape(-1)
    n = flat.numel()
    if form.startswith("bulk"):
        chunk = int(form[4:] or 16384)
        per = 32
        chunks = triton.cdiv(n, chunk)
        _bulk_kernel[(triton.cdiv(chunks, per),)](flat, n, CHUNK=chunk, PER=per, num_warps=1)
    else:
        per = 1024
        _line_kernel[(triton.cdiv(triton.cdiv(n, 128), per),)](flat, n, PER=per, num_warps=4)


def graph_us(fn, chains: int, replays: int = 20, reps: int = 7) -> float:
    fn()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    g.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        for _ in range(replays):
            g.replay()
        e.record()
        torch.cuda.synchronize()
        times.append(s.elapsed_time(e) * 1000 / replays / chains)
    return statistics.median(times)


def main() -> int:
    dev = torch.device("cuda")
    torch.manual_seed(0)
    H, E, INTER, N_O, K_O = 2304, 256, 1024, 2304, 4096
    chains = 16
    routing = RoutingParams(E, 8, routed_scaling_factor=2.446, num_fused_shared_experts=1)
    x = torch.randn(1, H, device=dev, dtype=torch.bfloat16)
    res = torch.randn(1, H, device=dev, dtype=torch.bfloat16)
    nw = torch.rand(H, device=dev, dtype=torch.bfloat16) + 0.5
    gates = [torch.randn(E, H, device=dev) * 0.02 for _ in range(chains)]
    bias = torch.randn(E, device=dev) * 0.01
    sems = [torch.zeros(1, dtype=torch.int32, device=dev) for _ in range(chains)]
    copies = 4
    w13 = [torch.randn(E + 1, 2 * INTER, H, device=dev, dtype=torch.bfloat16) * 0.02
           for _ in range(copies)]  # fmt: skip
    w2 = [torch.randn(E + 1, H, INTER, device=dev, dtype=torch.bfloat16) * 0.02
          for _ in range(copies)]  # fmt: skip
    fp8 = torch.float8_e4m3fn
    wo = [(torch.randn(N_O, K_O, device=dev) * 0.5).to(fp8) for _ in range(chains)]
    wo_s = [torch.rand(N_O, 1, device=dev) * 0.01 for _ in range(chains)]
    a = (torch.randn(1, K_O, device=dev)).to(fp8)
    a_s = torch.full((1, 1), 0.01, device=dev)
    act = SiluAndMul()
    side = torch.cuda.Stream()

    def router(i):
        return fused_norm_router_topk(x, res, nw, 1e-5, gates[i], bias, routing, sems[i])

    def chain(kind, variant, form):
        def fn():
            for i in range(chains):
                main_s = torch.cuda.current_stream()
                if variant != "plain":
                    side.wait_stream(main_s)
                    with torch.cuda.stream(side):
                        if kind == "moe":
                            c = i % copies
                            prefetch(w13[c][E], form)
                            prefetch(w2[c][E], form)
                        else:
                            prefetch(wo[i], form)
                h, _, w, ids = router(i)
                if variant == "join_before":
                    main_s.wait_stream(side)
                if kind == "moe":
                    c = i % copies
                    moe_experts_triton(h, w13[c], w2[c], w, ids, act)
                elif kind == "oproj":
                    gemv_fp8(a, a_s, wo[i], wo_s[i])
                if variant == "join_after":
                    main_s.wait_stream(side)

        return fn

    name = torch.cuda.get_device_name()
    print(f"# {name}, torch {torch.__version__}, triton {triton.__version__}")
    # Alone: the prefetch's own speed on the o_proj weights.
    for form in ("bulk1024", "bulk2048", "bulk4096", "bulk8192", "bulk16384", "line"):
        us = graph_us(lambda form=form: [prefetch(wo[i], form) for i in range(chains)], chains)
        print(f"prefetch alone {form:10s} {us:7.2f} us / 9.4 MB = {9.437e6 / us / 1e6:5.2f} TB/s")
    us_r = graph_us(lambda: [router(i) for i in range(chains)], chains)
    print(f"router alone {us_r:7.2f} us")
    us_o = graph_us(lambda: [gemv_fp8(a, a_s, wo[i], wo_s[i]) for i in range(chains)], chains)
    print(f"o_proj GEMV alone {us_o:7.2f} us")
    us_hot = graph_us(lambda: [gemv_fp8(a, a_s, wo[0], wo_s[0]) for i in range(chains)], chains)
    print(f"o_proj GEMV, one weight (L2-hot) {us_hot:7.2f} us")
    rounds = 3
    for kind in ("oproj", "moe"):
        results: dict[str, list[float]] = {}
        for _ in range(rounds):
            for variant, form in (
                ("plain", ""), ("join_before", "bulk16384"), ("join_before", "bulk4096"),
                ("join_after", "bulk4096"), ("join_before", "bulk8192"), ("join_before", "line"),
            ):  # fmt: skip
                name = f"{variant} {form}"
                results.setdefault(name, []).append(graph_us(chain(kind, variant, form), chains))
        base = statistics.median(results["plain "])
        for name, vals in results.items():
            med = statistics.median(vals)
            print(f"{kind:6s} {name:24s} {med:7.2f} us/chain  ({base - med:+6.2f} vs plain) "
                  f"[{', '.join(f'{v:.2f}' for v in vals)}]")  # fmt: skip
        sys.stdout.flush()
    # Same values with and without the prefetch (it only moves bytes).
    h, _, w, ids = router(0)
    ref = moe_experts_triton(h, w13[0], w2[0], w, ids, act)
    prefetch(w13[0][E], "bulk16384")
    torch.cuda.synchronize()
    assert torch.equal(ref, moe_experts_triton(h, w13[0], w2[0], w, ids, act))
    print("values equal with the prefetch")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
