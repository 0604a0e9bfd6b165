"""Benchmark the GEMV's static-weight launch (vllm/model_executor/kernels/linear/gemv.py, "Static
weights": each program's first weight tile loaded before its PDL wait) against the plain launch,
where the layers run it at a batch-1 decode: right after a short kernel that writes its row.

  o_proj       rms_norm(x), per_token_fp8_quant, then gemv_fp8 (4096 -> 2304, FP8): the KDA
               o_proj after its quantizing epilogue (two short launches here, one there)
  mla_q_kv_a   rms_norm(x), then gemv (2304 -> 6720, bf16): MLA's input norm and q | kv_a

Modes: `static` (the early loads: the layers' launch of o_proj; q | kv_a they launch plain),
`plain` and `before` (the chain's launches before the GEMV alone, so that chain minus before is
what the GEMV adds). Timing:
CUDA-graph replay of one chain per weight copy over --copies rotating copies of the weight (>= 16,
so that no chain finds its weight in the H200's 50 MB L2), microseconds per chain, PDL as the
engine launches it (unless VLLM_TRITON_PDL=0). % of copy counts the weight bytes over the time the
GEMV adds, against an eager `copy_` of --copy-gib GiB in the same run. Each chain's static and
plain outputs are compared bit for bit first.

    python benchmarks/kernels/benchmark_gemv_static_weight.py --csv static_weight.csv
    python benchmarks/kernels/benchmark_gemv_static_weight.py --dry-run   # tiny shapes, CPU
"""

import argparse
import sys

import torch
from kernel_bench import (
    add_common_args,
    note_dry_run_ignores,
    print_copy_gbps,
    require_gpu,
    round_like_the_gpu_if_interpreting,
    time_eager,
    time_graph,
    write_csv,
)

from vllm.model_executor.kernels.linear.gemv import gemv, gemv_fp8
from vllm.model_executor.layers.ops.rms_norm import rms_norm
from vllm.model_executor.layers.quantization.utils.fp8_per_token import per_token_fp8_quant
from vllm.platforms import current_platform
from vllm.utils.cli import run_main

SHAPES = {"o_proj": (4096, 2304), "mla_q_kv_a": (2304, 6720)}
DRY_RUN_SHAPE = (256, 48)  # (K, N) of every chain in the dry run
MODES = ("static", "plain", "before")
EPS = 1e-6


class Chain:
    """One chain's operands: the row, the norm weight and the weight copies (FP8 codes with
    their per-channel scales for o_proj)."""

    def __init__(self, name: str, k: int, n: int, copies: int, device, gen) -> None:
        self.name = name
        self.x = torch.randn(1, k, generator=gen, device=device).to(torch.bfloat16)
        self.norm_w = (1 + 0.1 * torch.randn(k, generator=gen, device=device)).to(torch.bfloat16)
        base = torch.randn(n, k, generator=gen, device=device) * k**-0.5
        if name == "o_proj":
            fp8 = current_platform.fp8_dtype()
            amax = base.abs().amax(dim=1, keepdim=True)
            self.w_scale = amax / current_platform.fp8_max()
            base = (base / self.w_scale).to(fp8)
        else:
            base = base.to(torch.bfloat16)
        self.weights = [base.clone() for _ in range(copies)]
        self.weight_bytes = base.numel() * base.element_size()

    def before(self):
        h = rms_norm(self.x, self.norm_w, EPS)
        return per_token_fp8_quant(h) if self.name == "o_proj" else h

    def call(self, w: torch.Tensor, static: bool):
        """The chain on weight copy ``w``: the launches before the GEMV, then the GEMV."""
        h = self.before()
        if self.name == "o_proj":
            return gemv_fp8(*h, w, self.w_scale, static_weight=static)
        return gemv(h, w, static_weight=static)

    def calls(self, mode: str) -> list:
        if mode == "before":
            return [self.before for _ in self.weights]
        return [lambda w=w: self.call(w, mode == "static") for w in self.weights]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--chains", nargs="+", choices=list(SHAPES), default=list(SHAPES), help="what to time"
    )
    parser.add_argument("--copies", type=int, default=16, help="rotating weight copies (>= 16)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the weights and rows")
    add_common_args(
        parser, dry_run="tiny shapes on the CPU, eager timing: checks the script, measures nothing"
    )
    args = parser.parse_args(argv)
    if args.dry_run:
        note_dry_run_ignores(parser, args, ignored=("copies", "copy_gib"))
        round_like_the_gpu_if_interpreting()
        device, copies, copy = torch.device("cpu"), 2, None
    else:
        require_gpu(parser)
        if args.copies < 16:
            parser.error(f"--copies must be at least 16 (L2 residency), got {args.copies}")
        device, copies = torch.device("cuda"), args.copies
        copy = print_copy_gbps(args.copy_gib)
    gen = torch.Generator(device=device).manual_seed(args.seed)
    rows: list[dict[str, object]] = []
    with torch.inference_mode():
        for name in args.chains:
            k, n = DRY_RUN_SHAPE if args.dry_run else SHAPES[name]
            chain = Chain(name, k, n, copies, device, gen)
            static, plain = (chain.call(chain.weights[0], s) for s in (True, False))
            if not torch.equal(static, plain):
                diff = (static.float() - plain.float()).abs().max().item()
                raise SystemExit(f"{name}: static and plain outputs differ (max |diff| {diff:.3g})")
            times = {}
            for mode in MODES:
                calls = chain.calls(mode)

                def run_all(calls=calls):
                    for call in calls:
                        call()

                if device.type == "cuda":
                    times[mode] = time_graph(run_all, 1) / len(calls)
                else:
                    times[mode] = time_eager(run_all, device) / len(calls)
                # The GEMV's share (gemv_us, pct_copy) is filled in once `before`, last, ran.
                row = dict(chain=name, k=k, n=n, mode=mode, us=round(times[mode], 2))
                rows.append(row)
                write_csv(args.csv, rows)
                print(f"{name:>11} {mode:>6} {times[mode]:8.2f} us", flush=True)
            for row in rows[-len(MODES) : -1]:
                added = row["us"] - times["before"]
                row["gemv_us"] = round(added, 2)
                if copy is not None and added > 0:
                    gbps = chain.weight_bytes / (added * 1e-6) / 1e9
                    row["pct_copy"] = round(100 * gbps / copy, 1)
            write_csv(args.csv, rows)
            saved = times["plain"] - times["static"]
            share = "".join(
                f", {r['mode']} adds {r['gemv_us']:.2f} us"
                + (f" ({r['pct_copy']}% of copy)" if "pct_copy" in r else "")
                for r in rows[-len(MODES) : -1]
            )
            print(f"{name:>11}: static saves {saved:.2f} us a chain{share}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(run_main(main))
