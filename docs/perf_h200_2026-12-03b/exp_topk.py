"""Experiment (call 65, run from the repository root; not part of the package): cost of the
router's top-8-of-256 selection by algorithm and warps.

One program per token reads 256 fp32 logits, does Kimi's selection (sigmoid, bias, top-8,
renormalise, scale, one shared column) and stores 9 weights and ids. Variants of the top-8 step:
sort (router.py's today), argmax (8 rounds of tl.max over the distinct int64 keys), none (the first
8 lanes: the floor of everything but the selection). Graph replay of 26 launches with PDL.
"""

import sys

import torch
import triton
import triton.language as tl

sys.path[:0] = ["benchmarks/kernels", "."]
from kernel_bench import time_graph  # noqa: E402

from vllm.triton_utils.pdl import pdl_wait  # noqa: E402


@triton.jit
def _sel(
    logits_ptr,
    bias_ptr,
    w_ptr,
    ids_ptr,
    scale,
    E: tl.constexpr,
    TOP_K: tl.constexpr,
    BLOCK_K: tl.constexpr,
    MODE: tl.constexpr,
    PDL: tl.constexpr,
):
    pdl_wait(PDL)
    t = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, E)
    x = tl.load(logits_ptr + t * E + offs)
    bias = tl.load(bias_ptr + offs)
    scores = tl.div_rn(tl.full([E], 1.0, tl.float32), 1.0 + tl.exp(-x))
    choice = scores + bias
    bits = choice.to(tl.int32, bitcast=True)
    key = (bits ^ ((bits >> 31) & 0x7FFFFFFF)).to(tl.int64) << 32
    key += E - offs
    k_offs = tl.arange(0, BLOCK_K)
    if MODE == 0:
        ranked = tl.reshape(tl.sort(key, descending=True), [E // BLOCK_K, BLOCK_K])
        row = tl.arange(0, E // BLOCK_K)
        leading = tl.sum(tl.where(row[:, None] == 0, ranked, 0), axis=0)
    elif MODE == 1:
        leading = tl.zeros([BLOCK_K], tl.int64)
        rest = key
        for r in tl.static_range(TOP_K):
            top = tl.max(rest, axis=0)
            leading = tl.where(k_offs == r, top, leading)
            rest = tl.where(rest == top, -9223372036854775807 - 1, rest)
    else:
        leading = (E - k_offs).to(tl.int64)
    ids = E - leading.to(tl.int32)
    hit = (offs[None, :] == ids[:, None]) & (k_offs < TOP_K)[:, None]
    weights = tl.sum(tl.where(hit, scores[None, :], 0.0), axis=1)
    total = tl.sum(weights, axis=0) + 1e-20
    weights = tl.div_rn(weights, tl.broadcast_to(total, [BLOCK_K])) * scale
    shared = k_offs >= TOP_K
    weights = tl.where(shared, 1.0, weights)
    ids = tl.where(shared, E + k_offs - TOP_K, ids)
    ok = k_offs < TOP_K + 1
    tl.store(w_ptr + t * BLOCK_K + k_offs, weights, mask=ok)
    tl.store(ids_ptr + t * BLOCK_K + k_offs, ids.to(tl.int64), mask=ok)


def main():
    dev = torch.device("cuda")
    layers = 26
    for tokens in (1, 8, 64, 256):
        logits = [torch.randn(tokens, 256, device=dev) for _ in range(layers)]
        bias = [torch.randn(256, device=dev) * 0.1 for _ in range(layers)]
        w = torch.empty(tokens, 16, device=dev)
        ids = torch.empty(tokens, 16, dtype=torch.int64, device=dev)
        ref = {}
        line = []
        for mode, name in ((0, "sort"), (1, "argmax"), (2, "none")):
            for warps in (1, 2, 4, 8):

                def fn(
                    mode=mode, warps=warps, tokens=tokens, logits=logits, bias=bias, w=w, ids=ids
                ):
                    for i in range(layers):
                        _sel[(tokens,)](
                            logits[i],
                            bias[i],
                            w,
                            ids,
                            2.446,
                            E=256,
                            TOP_K=8,
                            BLOCK_K=16,
                            MODE=mode,
                            PDL=True,
                            num_warps=warps,
                            launch_pdl=True,
                        )

                fn()
                torch.cuda.synchronize()
                if mode < 2:
                    got = (ids[:, :9].clone(), w[:, :9].clone())
                    if "ids" in ref:
                        assert torch.equal(got[0], ref["ids"]), (name, warps)
                        assert torch.equal(got[1], ref["w"]), (name, warps)
                    else:
                        ref["ids"], ref["w"] = got
                us = time_graph(fn, 1, reps=30) / layers
                line.append(f"{name}/w{warps} {us:.2f}")
        print(f"T={tokens}: " + "  ".join(line), flush=True)
    # against torch.topk on the last layer's data
    choice = torch.sigmoid(logits[-1]) + bias[-1]
    top = torch.topk(choice, 8, dim=-1).indices
    print("ids equal torch.topk:", torch.equal(top, ref["ids"][:, :8]))


main()
