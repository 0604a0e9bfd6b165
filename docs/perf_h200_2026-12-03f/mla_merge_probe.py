"""Probe (H200): `mla_decode_paged` at its default launch (split kernel, then the merge kernel)
for Kimi-Linear's MLA decode (32 heads, latent 512, rope 64, bf16, 16-token blocks), graph-replayed
with rotating block tables over disjoint copies of the cache (>= 256 MiB read a replay, so the
cache comes from HBM). Run once per tree (PYTHONPATH) to compare merge kernels; prints us a call,
the default config and % of the eager copy bandwidth on the cache bytes. Besides full sequences
(capacity = context + 32, as in the engine) it times short ones in a long capacity, where the
merge kernel reads every split's partial, live or not.
"""

import statistics
import sys

import torch

sys.path.insert(0, "benchmarks/kernels")
from benchmark_mla_decode import make_case  # noqa: E402

from vllm.models.kimi_k3.amd.ops.mla_decode import mla_decode_paged  # noqa: E402
from vllm.models.kimi_k3.amd.ops.mla_decode_config import mla_decode_config  # noqa: E402
from vllm.triton_utils import max_shared_memory, num_sms  # noqa: E402


def copy_bandwidth() -> float:
    src = torch.empty(2 * 1024**3, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    dst.copy_(src)
    torch.cuda.synchronize()
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    s.record()
    for _ in range(5):
        dst.copy_(src)
    e.record()
    torch.cuda.synchronize()
    return 2 * src.numel() * 5 / (s.elapsed_time(e) / 1000)


def main() -> int:
    copy_bw = copy_bandwidth()
    gpu = torch.cuda.get_device_name()
    print(f"# {gpu}, torch {torch.__version__}; copy {copy_bw / 1e9:.0f} GB/s")
    cases = [(1, 1024, 0), (1, 8192, 0), (1, 32768, 0), (8, 8192, 0), (64, 8192, 0),
             (1, 1024, 8192), (1, 1024, 32768), (1, 256, 32768), (64, 1024, 8192)]  # fmt: skip
    for batch, ctx, room in cases:
        cache_bytes = batch * ctx * 576 * 2
        copies = max(2, -(-(256 * 2**20) // cache_bytes))
        # The engine's capacity: the room (the context by default) + 32, in 16-token blocks.
        capacity = -(-((room or ctx) + 32) // 16) * 16
        case, tables = make_case(batch, ctx, 16, "cuda", torch.bfloat16, 0, copies, capacity)
        dev = torch.device("cuda")
        config = mla_decode_config(batch, 32, 512, capacity, num_sms(dev), max_shared_memory(dev))

        def fn(case=case, tables=tables):
            for table in tables:
                mla_decode_paged(**dict(case, block_tables=table))

        fn()
        torch.cuda.synchronize()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            fn()
        times = []
        for _ in range(7):
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record()
            for _ in range(10):
                g.replay()
            e.record()
            torch.cuda.synchronize()
            times.append(s.elapsed_time(e) * 1000 / 10 / len(tables))
        us = statistics.median(times)
        pct = cache_bytes / (us * 1e-6) / copy_bw * 100
        print(f"batch {batch:3d} ctx {ctx:6d} cap {capacity:6d} splits {config.num_splits:3d} "
              f"h{config.block_h} {us:8.2f} us  {pct:5.1f}% of copy")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
