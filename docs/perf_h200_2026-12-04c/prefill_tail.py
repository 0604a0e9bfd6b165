"""Device-call probe (twenty-sixth run): `benchmarks/benchmark_latency.py` with the 128-row
prefill tiles' `tail_block_m` set to argv[1], and the routed rows per expert of the first 26
MoE calls of 8192 tokens (the warm-up's 8k prefill) written to argv[2] and summarized: padded rows
of 128-row blocks, and how many last blocks hold at most 16 / 32 / 64 rows.

    python prefill_tail.py 32 hist.json <benchmark_latency.py arguments>
"""

import json
import sys

import torch

sys.path.insert(0, "benchmarks")

import benchmark_latency  # noqa: E402

import vllm.model_executor.layers.fused_moe.experts_triton_grouped as grouped  # noqa: E402

LAYERS = 26


def main() -> int:
    tail, hist_path, argv = int(sys.argv[1]), sys.argv[2], sys.argv[3:]
    grouped._TMA_LARGE_PREFILL_TILES = grouped._TMA_LARGE_PREFILL_TILES._replace(tail_block_m=tail)
    counts: list[list[int]] = []
    group_rows = grouped.group_rows

    def recording(topk_ids, num_experts, block_m):
        if len(counts) < LAYERS and topk_ids.shape[0] >= 8192:
            ids = topk_ids.flatten().long()
            counts.append(torch.bincount(ids, minlength=num_experts).tolist())
        return group_rows(topk_ids, num_experts, block_m)

    grouped.group_rows = recording
    rc = benchmark_latency.main(argv)
    with open(hist_path, "w") as f:
        json.dump(counts, f)
    total = padded = 0
    tails = {16: 0, 32: 0, 64: 0}
    blocks = 0
    for layer in counts:
        for n in layer:
            total += n
            padded += -(-n // 128) * 128
            blocks += -(-n // 128)
            last = n % 128
            for t in tails:
                tails[t] += 0 < last <= t
    if counts:
        print(
            f"routed rows of {len(counts)} layers: {total}, in 128-row blocks {padded} "
            f"({100 * (padded - total) / padded:.1f}% padding), {blocks} blocks; last blocks "
            + ", ".join(f"<= {t} rows: {c}" for t, c in tails.items())
        )
        per = [sorted(layer, reverse=True) for layer in counts]
        print("largest / median / smallest expert rows per layer (first 4 layers):")
        for layer in per[:4]:
            print(f"  {layer[0]} / {layer[len(layer) // 2]} / {layer[-1]}")
    return rc


if __name__ == "__main__":
    sys.exit(main())
