"""Probe (H200): the one-token MoE gate/up kernel with its steps over H software-pipelined by
Triton (`tl.range(..., num_stages=S)`: the weight and x tiles go through cp.async into shared
memory, S - 1 steps in flight, no registers held for them), against the production kernel
(`_moe_gate_up_kernel`, steps unrolled, loads in registers). Kimi-Linear-48B shapes: H 2304, I
1024, 8 routed experts + the fused shared slot, one token. 16 launches a graph, each with its own
random experts; us per launch and % of the eager copy bandwidth on the 9 experts' w13 bytes.
The staged kernel's outputs must equal the production kernel's bit for bit (same sums, same
order).
"""

import statistics

import torch
import triton
import triton.language as tl

from vllm.model_executor.layers.fused_moe.experts_triton import _moe_gate_up_kernel


@triton.jit
def _step(x_row, gate_ptrs, up_ptrs, kk, k0, hidden, n_ok, acc_gate, acc_up):
    k_ok = k0 + kk < hidden
    mask = n_ok[:, None] & k_ok[None, :]
    rows = tl.zeros([n_ok.shape[0], 1], dtype=tl.int32)
    xv = tl.load(x_row + rows + (k0 + kk)[None, :], mask=mask, other=0.0).to(tl.float32)
    gate = tl.load(gate_ptrs + k0, mask=mask, other=0.0)
    up = tl.load(up_ptrs + k0, mask=mask, other=0.0)
    acc_gate += tl.sum(gate.to(tl.float32) * xv, axis=1)
    acc_up += tl.sum(up.to(tl.float32) * xv, axis=1)
    return acc_gate, acc_up


@triton.jit
def _staged_kernel(
    x_ptr, w13_ptr, ids_ptr, a_ptr,
    stride_xt, stride_it, stride_ik, stride_we, stride_wn, stride_ar,
    hidden, inter,
    TOPK: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, HIDDEN: tl.constexpr,
    STAGES: tl.constexpr,
):  # fmt: skip
    r = tl.program_id(0)
    t = r // TOPK
    e = tl.load(ids_ptr + t * stride_it + (r % TOPK) * stride_ik).to(tl.int64)
    n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = n < inter
    kk = tl.arange(0, BLOCK_K)
    gate_ptrs = w13_ptr + e * stride_we + n[:, None] * stride_wn + kk[None, :]
    up_ptrs = gate_ptrs + inter * stride_wn
    x_row = x_ptr + t * stride_xt
    acc_gate = tl.zeros([BLOCK_N], dtype=tl.float32)
    acc_up = tl.zeros([BLOCK_N], dtype=tl.float32)
    for k0 in tl.range(0, HIDDEN, BLOCK_K, num_stages=STAGES):
        acc_gate, acc_up = _step(x_row, gate_ptrs, up_ptrs, kk, k0, HIDDEN, n_ok, acc_gate,
                                 acc_up)  # fmt: skip
    dtype = a_ptr.dtype.element_ty
    gate = acc_gate.to(dtype).to(tl.float32)
    up = acc_up.to(dtype).to(tl.float32)
    act = (gate / (1.0 + tl.exp(-gate))).to(dtype).to(tl.float32)
    tl.store(a_ptr + r * stride_ar + n, (act * up).to(dtype), mask=n_ok)


def graph_us(fn, launches: int, replays: int = 20, reps: int = 7) -> float:
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
        times.append(s.elapsed_time(e) * 1000 / replays / launches)
    return statistics.median(times)


def main() -> int:
    dev = torch.device("cuda")
    torch.manual_seed(0)
    H, INTER, E, K = 2304, 1024, 257, 9
    chains = 16
    w13 = torch.randn(E, 2 * INTER, H, device=dev, dtype=torch.bfloat16) * 0.02
    x = torch.randn(1, H, device=dev, dtype=torch.bfloat16)
    ids = [torch.cat([torch.randperm(256, device=dev)[:8], torch.tensor([256], device=dev)])
           .view(1, K) for _ in range(chains)]  # fmt: skip
    a = [torch.empty(K, INTER, device=dev, dtype=torch.bfloat16) for _ in range(chains)]
    src = torch.empty(2 * 1024**3, dtype=torch.uint8, device=dev)
    dst = torch.empty_like(src)
    dst.copy_(src)
    torch.cuda.synchronize()
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    s.record()
    for _ in range(5):
        dst.copy_(src)
    e.record()
    torch.cuda.synchronize()
    copy_bw = 2 * src.numel() * 5 / (s.elapsed_time(e) / 1000)
    del src, dst
    bytes_per = K * 2 * INTER * H * 2

    def args(i):
        return (x, w13, ids[i], a[i], x.stride(0), ids[i].stride(0), ids[i].stride(1),
                w13.stride(0), w13.stride(1), a[i].stride(0), H, INTER)  # fmt: skip

    def prod(block_n=8, block_k=256, warps=4):
        def fn():
            for i in range(chains):
                _moe_gate_up_kernel[(K, triton.cdiv(INTER, block_n))](
                    *args(i), TOPK=K, BLOCK_N=block_n, BLOCK_K=block_k, HIDDEN=H, num_warps=warps
                )

        return fn

    def staged(block_n, block_k, stages, warps):
        def fn():
            for i in range(chains):
                _staged_kernel[(K, triton.cdiv(INTER, block_n))](
                    *args(i), TOPK=K, BLOCK_N=block_n, BLOCK_K=block_k, HIDDEN=H, STAGES=stages,
                    num_warps=warps, num_stages=stages,
                )  # fmt: skip

        return fn

    name = torch.cuda.get_device_name()
    print(f"# {name}, torch {torch.__version__}, triton {triton.__version__}")
    print(f"copy {copy_bw / 1e9:.0f} GB/s; w13 bytes a launch {bytes_per / 1e6:.1f} MB")
    prod()()
    torch.cuda.synchronize()
    ref = [t.clone() for t in a]
    cases = [("production n8 k256 w4", prod())]
    for block_n, block_k, stages, warps in ((8, 256, 2, 4), (8, 256, 3, 4), (8, 256, 4, 4),
                                            (8, 128, 4, 4), (8, 128, 6, 4), (16, 256, 3, 4),
                                            (16, 128, 4, 4), (4, 256, 3, 2), (8, 512, 3, 4),
                                            (16, 256, 3, 8), (8, 256, 3, 2)):  # fmt: skip
        name = f"staged n{block_n} k{block_k} s{stages} w{warps}"
        fn = staged(block_n, block_k, stages, warps)
        for t in a:
            t.zero_()
        fn()
        torch.cuda.synchronize()
        same = all(torch.equal(r, t) for r, t in zip(ref, a, strict=True))
        cases.append((name + ("" if same else " (values differ)"), fn))
    results: dict[str, list[float]] = {}
    for _ in range(3):
        for name, fn in cases:
            results.setdefault(name, []).append(graph_us(fn, chains))
    for name, vals in results.items():
        us = statistics.median(vals)
        print(f"{name:40s} {us:7.2f} us  {bytes_per / (us * 1e-6) / copy_bw * 100:5.1f}% of copy "
              f"[{', '.join(f'{v:.2f}' for v in vals)}]")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
