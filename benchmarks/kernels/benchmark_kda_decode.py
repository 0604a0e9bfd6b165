"""Benchmark one KDA decode step: the unfused chain against the fork's fused decode + PTPC epilogue.

Shapes: Kimi-K3 per GPU at TP8 (12 heads x 128) and Kimi-Linear (32 heads x 128), batch 1-256.

  unfused  conv-state update, gates (torch ops), fla-core `fused_recurrent_kda`, fla-core
           `FusedRMSNormGated` (sigmoid), then `per_token_fp8_quant`
  fused    `fused_kda_decode` with its gated-RMSNorm epilogue, then `per_token_fp8_quant`
           (the layer's already-normed PTPC path)

Each provider is timed as CUDA-graph replay (what a decode step pays) and its kernels per layer are
counted with the torch profiler over one eager call. Prints a table; `--csv` writes it.

    python benchmarks/kernels/benchmark_kda_decode.py --csv kda_decode.csv
"""

import argparse
import sys

import torch
from benchmark_rmsnorm_gated_fp8_per_token import time_graph, write_csv

from vllm.models.kimi_k3.amd.ops.causal_conv1d import causal_conv1d_decode
from vllm.models.kimi_k3.amd.ops.fused_kda_decode import fused_kda_decode
from vllm.models.kimi_k3.amd.ops.kda_gate import kda_gate
from vllm.models.kimi_k3.amd.ops.rmsnorm_gated_fp8_per_token import per_token_fp8_quant

SHAPES = {"kimi-k3-tp8": 12, "kimi-linear": 32}
BATCHES = [1, 2, 4, 8, 16, 32, 64, 128, 256]
HEAD_DIM, WIDTH = 128, 4


def make_step(batch: int, heads: int, lower_bound: float | None):
    d, proj = HEAD_DIM, heads * HEAD_DIM
    cuda = dict(device="cuda")
    projected = torch.randn(batch, 4 * proj + d + heads, dtype=torch.bfloat16, **cuda)
    return dict(
        mixed_qkv=projected[:, : 3 * proj],
        conv_weight=torch.randn(3 * proj, WIDTH, **cuda) * 0.5,
        conv_state=torch.randn(batch, 3 * proj, WIDTH - 1, dtype=torch.bfloat16, **cuda),
        raw_g=torch.randn(batch, proj, dtype=torch.bfloat16, **cuda),
        A_log=torch.log(torch.rand(heads, **cuda) * 15 + 1),
        dt_bias=torch.randn(proj, **cuda) * 0.5,
        lower_bound=lower_bound,
        b=projected[:, -heads:],
        ssm_state=torch.randn(batch, heads, d, d, **cuda) * 0.1,
        slots=torch.arange(batch, **cuda),
        gate=projected[:, 3 * proj : 4 * proj].view(batch, heads, d),
        norm_weight=torch.ones(d, dtype=torch.bfloat16, **cuda),
    )


def unfused(step, norm):
    from fla.ops.kda import fused_recurrent_kda

    n, heads = step["b"].shape
    d = HEAD_DIM
    conv = causal_conv1d_decode(
        step["mixed_qkv"], step["conv_weight"], step["conv_state"], step["slots"]
    )
    q, k, v = (t.reshape(1, n, heads, d) for t in conv.split(heads * d, dim=-1))
    g = kda_gate(step["raw_g"], step["A_log"], step["dt_bias"], step["lower_bound"])
    beta = torch.sigmoid(step["b"].float())
    cu = torch.arange(n + 1, device="cuda")
    o, final = fused_recurrent_kda(
        q, k, v, g.unsqueeze(0), beta.unsqueeze(0), initial_state=step["ssm_state"],
        output_final_state=True, use_qk_l2norm_in_kernel=True, cu_seqlens=cu,
    )  # fmt: skip
    step["ssm_state"].copy_(final)
    y = norm(o.squeeze(0), step["gate"])
    return per_token_fp8_quant(y.reshape(n, heads * d))


def fused(step):
    core = fused_kda_decode(**step)
    return per_token_fp8_quant(core.reshape(core.shape[0], -1))


def count_kernels(fn) -> int:
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    return sum(1 for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--batches", type=int, nargs="+", default=BATCHES, help="decode batch sizes"
    )
    parser.add_argument(
        "--shapes", nargs="+", default=list(SHAPES), choices=list(SHAPES), help="model shapes"
    )
    parser.add_argument("--lower-bound", type=float, default=-5.0, help="gate lower bound (K3)")
    parser.add_argument("--graph-calls", type=int, default=20, help="calls per captured graph")
    parser.add_argument("--csv", help="write the results to this CSV file")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        parser.error("this benchmark needs a CUDA or ROCm GPU")

    from fla.modules import FusedRMSNormGated

    norm = FusedRMSNormGated(HEAD_DIM, eps=1e-5, activation="sigmoid").to("cuda", torch.bfloat16)
    rows = []
    with torch.inference_mode():
        for shape in args.shapes:
            for batch in args.batches:
                step = make_step(batch, SHAPES[shape], args.lower_bound)
                providers = {
                    "unfused": lambda s=step: unfused(s, norm),
                    "fused": lambda s=step: fused(s),
                }
                row = dict(shape=shape, batch=batch)
                for name, fn in providers.items():
                    fn()
                    row[f"{name}_kernels"] = count_kernels(fn)
                    row[f"{name}_us"] = round(time_graph(fn, args.graph_calls), 3)
                row["speedup"] = round(row["unfused_us"] / row["fused_us"], 3)
                rows.append(row)
                write_csv(args.csv, rows)  # after every row: an interrupted run keeps its rows
                print(
                    f"{shape:>12} B={batch:>4} unfused {row['unfused_us']:7.2f} us "
                    f"({row['unfused_kernels']} kernels)  fused {row['fused_us']:7.2f} us "
                    f"({row['fused_kernels']} kernels)  {row['speedup']:.2f}x",
                    flush=True,
                )
    return 0


if __name__ == "__main__":
    sys.exit(main())
