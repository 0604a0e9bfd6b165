"""Device-call probe (twenty-sixth run): fla-core's `chunk_kda` as the engine calls it for one
8192-token prompt of Kimi-Linear's KDA layer (32 heads of 128; q, k, v bf16, g and beta fp32,
l2-normed q and k in the kernel, a zero initial state, final state out), timed with CUDA events
and broken down by kernel under torch.profiler."""

import torch
from fla.ops.kda import chunk_kda
from torch.profiler import ProfilerActivity, profile

T, H, D = 8192, 32, 128


def main() -> None:
    torch.manual_seed(0)
    dev = "cuda"
    q, k, v = (torch.randn(1, T, H, D, device=dev, dtype=torch.bfloat16) for _ in range(3))
    g = -torch.nn.functional.softplus(torch.randn(1, T, H, D, device=dev)) * 0.5
    beta = torch.rand(1, T, H, device=dev)
    h0 = torch.zeros(1, H, D, D, device=dev)
    cu = torch.tensor([0, T], device=dev, dtype=torch.long)

    def call():
        return chunk_kda(
            q,
            k,
            v,
            g,
            beta,
            initial_state=h0,
            output_final_state=True,
            use_qk_l2norm_in_kernel=True,
            cu_seqlens=cu,
        )

    for _ in range(3):
        call()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(10):
        call()
    end.record()
    torch.cuda.synchronize()
    us = start.elapsed_time(end) / 10 * 1000
    print(f"chunk_kda T={T} H={H} D={D}: {us:.0f} us a call (CUDA events)")
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(5):
            call()
        torch.cuda.synchronize()
    rows = {}
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            rows.setdefault(e.name, [0.0, 0])
            rows[e.name][0] += e.time_range.elapsed_us() / 5
            rows[e.name][1] += 1
    total = sum(us for us, _ in rows.values())
    print(f"device time a call {total:.0f} us")
    for name, (us, n) in sorted(rows.items(), key=lambda r: -r[1][0]):
        print(f"{us:9.1f} us {n // 5:3d} calls  {100 * us / total:5.1f}%  {name[:110]}")


if __name__ == "__main__":
    main()
