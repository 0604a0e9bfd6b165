"""Device-call probe (thirty-ninth run): can the KDA prefill core leave the host's critical path?

A 1k prompt's prefill is bound by the host (call 111: device busy 26%; call 41's cProfile put 61 of
132 ms of host time in fla-core's `chunk_kda`, its autotuner and launch paths). fla-core 0.6.0's
`chunk_kda(..., use_graph=True, max_num_seqs=N)` builds its chunk indices on the device at a fixed
shape (cu_seqlens padded with empty sequences to N + 1 entries; grid rows past the real chunks
return at once), so one call could be captured in a CUDA graph per token bucket and replayed by
every KDA layer. Per case (real tokens and sequence lengths, bucket T_pad >= tokens, N_max >= N),
as the engine calls it (q, k, v bf16 [1, T, 32, 128]; the raw gate bf16 with fla applying it,
A_log / dt_bias fp32; beta fp32; q/k l2-normed in the kernel; initial states; final states out):

1. eager, `use_graph=False` at the real shape: the reference;
2. eager, `use_graph=True` at T_pad / N_max: bits against 1 on the real rows and states;
3. 2 captured in a CUDA graph on static buffers and replayed: bits against 1;
4. host time a call (wall time of the launches, no sync, median of 20) for 1 and 3's replay;
5. device time a call (CUDA events around 10 back-to-back calls) for 1, 2 and 3.
"""

import statistics
import time

import torch
from fla.ops.kda import chunk_kda

H, D = 32, 128
CASES = [  # (sequence lengths, T_pad, N_max)
    ([1024], 1024, 1),
    ([1000], 1024, 4),
    ([1000, 1500, 596, 1000], 4096, 8),
    ([8192], 8192, 1),
]


def inputs(lens: list[int], t_pad: int, n_max: int, dev: str):
    t = sum(lens)
    gen = torch.Generator(device=dev).manual_seed(t)

    def rand(*shape, dtype=torch.bfloat16):
        x = torch.zeros(*shape, device=dev, dtype=dtype)
        x[:, :t] = torch.randn(1, t, *shape[2:], generator=gen, device=dev, dtype=dtype)
        return x

    q, k, v, g = (rand(1, t_pad, H, D) for _ in range(4))
    beta = torch.zeros(1, t_pad, H, device=dev)
    beta[:, :t] = torch.rand(1, t, H, generator=gen, device=dev)
    h0 = torch.randn(n_max, H, D, D, generator=gen, device=dev) * 0.1
    cu = torch.zeros(n_max + 1, dtype=torch.long, device=dev)
    cu[1 : len(lens) + 1] = torch.tensor(lens, device=dev).cumsum(0)
    cu[len(lens) + 1 :] = t
    a_log = torch.randn(H, generator=gen, device=dev)
    dt_bias = torch.randn(H * D, generator=gen, device=dev)
    return dict(q=q, k=k, v=v, g=g, beta=beta, h0=h0, cu=cu, A_log=a_log, dt_bias=dt_bias)


def call(x: dict, t: int, n: int, graph_mode: bool, n_max: int):
    sl = slice(None) if graph_mode else slice(0, t)
    return chunk_kda(
        x["q"][:, sl], x["k"][:, sl], x["v"][:, sl], x["g"][:, sl], x["beta"][:, sl],
        initial_state=x["h0"] if graph_mode else x["h0"][:n],
        output_final_state=True, use_qk_l2norm_in_kernel=True,
        cu_seqlens=x["cu"] if graph_mode else x["cu"][: n + 1],
        use_gate_in_kernel=True, A_log=x["A_log"], dt_bias=x["dt_bias"],
        use_graph=graph_mode, max_num_seqs=n_max if graph_mode else None,
    )  # fmt: skip


def device_us(fn, reps: int = 10) -> float:
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    start.record()
    for _ in range(reps):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / reps * 1000


def host_us(fn, reps: int = 20) -> float:
    samples = []
    for _ in range(reps):
        torch.cuda.synchronize()
        s = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - s) * 1e6)
    torch.cuda.synchronize()
    return statistics.median(samples)


def same(a: torch.Tensor, b: torch.Tensor) -> str:
    if torch.equal(a, b):
        return "same bits"
    diff = (a.float() - b.float()).abs().max().item()
    return f"DIFFERENT (max abs diff {diff:.3g})"


def run_case(lens: list[int], t_pad: int, n_max: int) -> None:
    t, n = sum(lens), len(lens)
    x = inputs(lens, t_pad, n_max, "cuda")
    for _ in range(3):  # fla-core's autotuning and compiles, both forms
        ref_o, ref_s = call(x, t, n, False, n_max)
        o, s = call(x, t, n, True, n_max)
    torch.cuda.synchronize()
    print(f"== lens {lens} (T {t}) bucket {t_pad}, N_max {n_max}")
    print(f"  eager use_graph: o {same(o[:, :t], ref_o)}, states {same(s[:n], ref_s)}")
    pool = torch.cuda.graph_pool_handle()
    graph = torch.cuda.CUDAGraph()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        call(x, t, n, True, n_max)  # warm-up on the capture stream
    torch.cuda.current_stream().wait_stream(stream)
    with torch.cuda.graph(graph, pool=pool):
        go, gs = call(x, t, n, True, n_max)
    # Fresh values in the static inputs: the replay must read them, not the captured ones.
    y = inputs(lens, t_pad, n_max, "cuda")
    y["q"].mul_(0.5)
    for key in x:
        x[key].copy_(y[key])
    graph.replay()
    torch.cuda.synchronize()
    ref_o, ref_s = call(x, t, n, False, n_max)
    print(f"  graph replay: o {same(go[:, :t], ref_o)}, states {same(gs[:n], ref_s)}")
    print(
        f"  host us a call: eager {host_us(lambda: call(x, t, n, False, n_max)):.0f}, "
        f"eager use_graph {host_us(lambda: call(x, t, n, True, n_max)):.0f}, "
        f"replay {host_us(graph.replay):.0f}"
    )
    print(
        f"  device us a call: eager {device_us(lambda: call(x, t, n, False, n_max)):.0f}, "
        f"eager use_graph {device_us(lambda: call(x, t, n, True, n_max)):.0f}, "
        f"replay {device_us(graph.replay):.0f}"
    )


def main() -> None:
    print(torch.cuda.get_device_name(), torch.__version__)
    for lens, t_pad, n_max in CASES:
        try:
            run_case(lens, t_pad, n_max)
        except Exception as exc:  # one case's failure must not hide the others'
            print(f"== lens {lens} bucket {t_pad}, N_max {n_max}: {type(exc).__name__}: {exc}")


if __name__ == "__main__":
    main()
