"""Device-call probe prepared in the twenty-eighth run for the next: why one 8k prompt's prefill
costs 2.6-4.7 ms more with cuDNN's per-length-class plans (calls 114, 118) where their device
time predicts at most ~1 ms, and what the alternatives cost. In one process with
TORCH_CUDNN_SDPA_AVOID_RECOMPILE=1 (as the engine runs), for new prompts as MLA passes them
(32 heads, q / k 192, v 128 split from one kv_b_proj output), per length:

- host us: wall time of one call without synchronizing, median of 20 after warm-up (the queue
  never fills: each call is a few launches);
- device ms: triton.testing.do_bench, L2 flushed;
- first ms: the first call at a length of its class never seen (a plan build, where any);
for these paths:
- classes: `mla_prefill_attention` as landed (per-length-class plans, q and v copied);
- shapes: cuDNN's per-shape plans (v read in place: not [S, H, D], so torch keeps them);
- bucket256: per-shape plans on lengths padded up to a multiple of 256 (pad rows: zero keys and
  values, discarded queries; exact under the upper-left causal mask), the pads' copies timed;
- nested: every sequence of a step in one call, as jagged nested tensors (3 sequences summing to
  the length), if torch's cuDNN takes it; its first call at new lengths.

    python prefill_host_probe.py
"""

import os
import time
import warnings

os.environ["TORCH_CUDNN_SDPA_AVOID_RECOMPILE"] = "1"

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from triton.testing import do_bench  # noqa: E402

from vllm.models.kimi_k3.amd.ops.mla_prefill import mla_prefill_attention, mla_prefill_key  # noqa: E402

warnings.simplefilter("ignore")
H, NOPE, ROPE, DV = 32, 128, 64, 128
QK = NOPE + ROPE
SCALE = QK**-0.5


def bhsd(x: torch.Tensor) -> torch.Tensor:
    return x.transpose(0, 1).unsqueeze(0)


def host_us(fn) -> float:
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(20):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1e6)
    torch.cuda.synchronize()
    return sorted(times)[len(times) // 2]


def first_ms(fn) -> float:
    torch.cuda.synchronize()
    start = time.perf_counter()
    fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - start) * 1e3


def operands(length: int, rows: int):
    # q as MLA passes it: a column slice of the fused projection's output rows.
    fused = torch.randn(rows, H * QK + 576, device="cuda", dtype=torch.bfloat16)
    q = fused[:length, : H * QK].view(length, H, QK)
    kv = torch.randn(rows, H, NOPE + DV, device="cuda", dtype=torch.bfloat16)
    kv[length:] = 0
    k_pe = torch.randn(rows, ROPE, device="cuda", dtype=torch.bfloat16)
    k_pe[length:] = 0
    return q, kv, k_pe


def paths(length: int) -> dict:
    padded = -(-length // 256) * 256
    q, kv, k_pe = operands(length, padded)
    k_nope, v = kv[:length, :, :NOPE], kv[:length, :, NOPE:]

    def classes():
        return mla_prefill_attention(q, k_nope, k_pe[:length], v, SCALE)

    def shapes():
        k = mla_prefill_key(k_nope, k_pe[:length])
        in_place = kv[:length, :, NOPE - (QK - DV) :]
        return F.scaled_dot_product_attention(
            bhsd(q), bhsd(k), bhsd(in_place), is_causal=True, scale=SCALE
        )

    def bucket256():
        qp = F.pad(q, (0, 0, 0, 0, 0, padded - length))
        k = mla_prefill_key(kv[:, :, :NOPE], k_pe)
        in_place = kv[:, :, NOPE - (QK - DV) :]
        out = F.scaled_dot_product_attention(
            bhsd(qp), bhsd(k), bhsd(in_place), is_causal=True, scale=SCALE
        )
        return out[0, :, :length]

    def nested():
        cuts = [0, length // 3, (2 * length) // 3 + 7, length]
        offsets = torch.tensor(cuts, device="cuda", dtype=torch.int64)
        k = mla_prefill_key(k_nope, k_pe[:length])
        vv = F.pad(v, (0, QK - DV))
        nt = [
            torch.nested.nested_tensor_from_jagged(x.contiguous(), offsets).transpose(1, 2)
            for x in (q, k, vv)
        ]
        return F.scaled_dot_product_attention(*nt, is_causal=True, scale=SCALE)

    return {"classes": classes, "shapes": shapes, "bucket256": bucket256, "nested": nested}


def main() -> None:
    print(f"torch {torch.__version__}, cuDNN {torch.backends.cudnn.version()}")
    print(f"{'L':>5} {'path':10} {'first ms':>9} {'host us':>8} {'device ms':>10}")
    for length in (3000, 4096, 5000, 6000, 8000, 8192):
        for name, fn in paths(length).items():
            try:
                first = first_ms(fn)
                host = host_us(fn)
                device = do_bench(fn, warmup=5, rep=40)
                print(f"{length:5d} {name:10} {first:9.2f} {host:8.1f} {device:10.3f}", flush=True)
            except Exception as exc:  # noqa: BLE001
                print(f"{length:5d} {name:10} failed: {str(exc)[:150]}", flush=True)


if __name__ == "__main__":
    main()
