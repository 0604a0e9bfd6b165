"""Benchmark the input RMSNorm fused into the one-row GEMV after it
(vllm/model_executor/kernels/linear/rms_norm_gemv.py) against the two launches it replaces, at
Kimi-Linear's KDA input projection (hidden 2304 -> 12576: q | k | v | f_a | g_a | b at TP 1).

  fused    fused_add_rms_norm_gemv(x, residual, norm_w, eps, w)
  unfused  fused_add_rms_norm(x, residual, norm_w, eps), then gemv(h, w)   (the layer before)
  gemv     gemv(h, w) alone: the fused launch's lower bound
  norm     fused_add_rms_norm alone

each with a residual (every decoder layer but the first) or without (`rms_norm`). Timing: CUDA-graph
replay of one call per weight copy over --copies rotating copies of the weight (>= 16, so that no
call finds its weight in the H200's 50 MB L2), microseconds per call; % of copy counts the weight
bytes against an eager `copy_` of --copy-gib GiB in the same run.

    python benchmarks/kernels/benchmark_rms_norm_gemv.py --csv rms_norm_gemv.csv
    python benchmarks/kernels/benchmark_rms_norm_gemv.py --dry-run   # tiny shape on the CPU
"""

import argparse
import sys
from dataclasses import replace

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

from vllm.model_executor.kernels.linear.gemv import gemv
from vllm.model_executor.kernels.linear.gemv_config import WIDE_TILE
from vllm.model_executor.kernels.linear.rms_norm_gemv import (
    fused_add_rms_norm_gemv,
    norm_gemv_config,
)
from vllm.model_executor.layers.ops.rms_norm import fused_add_rms_norm, rms_norm
from vllm.utils.cli import run_main

KDA_IN_PROJ = (2304, 12576)  # (hidden, N)
# The dry run's shape: hidden 256 takes the norm's one warp, so WIDE_TILE's tile under it.
DRY_RUN = (256, 48)
PATHS = ("fused", "unfused", "gemv", "norm")
EPS = 1e-6


def calls_for(path: str, x, residual, norm_w, weights, config):
    """One callable per weight copy: the path's launches on that copy."""

    def norm():
        if residual is None:
            return rms_norm(x, norm_w, EPS)
        return fused_add_rms_norm(x, residual, norm_w, EPS)[0]

    if path == "fused":
        return [
            lambda w=w: fused_add_rms_norm_gemv(x, residual, norm_w, EPS, w, config=config)
            for w in weights
        ]
    if path == "unfused":
        return [lambda w=w: gemv(norm(), w, config=config) for w in weights]
    if path == "gemv":
        h = norm()
        return [lambda w=w: gemv(h, w, config=config) for w in weights]
    return [norm for _ in weights]


def check(x, residual, norm_w, weights, config) -> None:
    """The fused launch against the two it replaces, bit for bit (rms_norm_gemv.py's claim on
    the GPU and under the interpreter); a failure ends the run."""
    out, new_res = fused_add_rms_norm_gemv(x, residual, norm_w, EPS, weights[0], config=config)
    if residual is None:
        h, ref_res = rms_norm(x, norm_w, EPS), x
    else:
        h, ref_res = fused_add_rms_norm(x, residual, norm_w, EPS)
    ref = gemv(h, weights[0], config=config)
    if not (torch.equal(out, ref) and torch.equal(new_res, ref_res)):
        diff = (out.float() - ref.float()).abs().max().item()
        raise SystemExit(f"fused and unfused outputs differ (max |diff| {diff:.3g})")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--copies", type=int, default=16, help="rotating weight copies (>= 16)")
    parser.add_argument(
        "--paths", nargs="+", choices=PATHS, default=list(PATHS), help="what to time"
    )
    parser.add_argument("--seed", type=int, default=0, help="seed of the weights and rows")
    add_common_args(
        parser, dry_run="a tiny shape on the CPU, eager timing: checks the script, measures nothing"
    )
    args = parser.parse_args(argv)
    if args.dry_run:
        note_dry_run_ignores(parser, args, ignored=("copies", "copy_gib"))
        round_like_the_gpu_if_interpreting()
        device, (hidden, n), copies = torch.device("cpu"), DRY_RUN, 2
        config = replace(WIDE_TILE, num_warps=1)
        copy = None
    else:
        require_gpu(parser)
        if args.copies < 16:
            parser.error(f"--copies must be at least 16 (L2 residency), got {args.copies}")
        device, (hidden, n), copies = torch.device("cuda"), KDA_IN_PROJ, args.copies
        config = norm_gemv_config(n, hidden)
        copy = print_copy_gbps(args.copy_gib)
    gen = torch.Generator(device=device).manual_seed(args.seed)
    x = torch.randn(1, hidden, generator=gen, device=device).to(torch.bfloat16)
    res = torch.randn(1, hidden, generator=gen, device=device).to(torch.bfloat16)
    norm_w = (1 + 0.1 * torch.randn(hidden, generator=gen, device=device)).to(torch.bfloat16)
    base = (torch.randn(n, hidden, generator=gen, device=device) * hidden**-0.5).to(x.dtype)
    weights = [base.clone() for _ in range(copies)]
    weight_bytes = base.numel() * base.element_size()
    print(f"[{n}, {hidden}] bf16 weight, {copies} copies; launch {config}", flush=True)
    rows: list[dict[str, object]] = []
    with torch.inference_mode():
        for residual in (res, None):
            check(x, residual, norm_w, weights, config)
            for path in args.paths:
                calls = calls_for(path, x, residual, norm_w, weights, config)

                def run_all(calls=calls):
                    for call in calls:
                        call()

                if device.type == "cuda":
                    us = time_graph(run_all, 1) / len(calls)
                else:
                    us = time_eager(run_all, device) / len(calls)
                row = dict(
                    residual=residual is not None, path=path, n=n, hidden=hidden, us=round(us, 2)
                )
                if copy is not None and path != "norm":
                    row["pct_copy"] = round(100 * weight_bytes / (us * 1e-6) / 1e9 / copy, 1)
                rows.append(row)
                write_csv(args.csv, rows)
                pct = f" {row['pct_copy']:5.1f}% of copy" if "pct_copy" in row else ""
                print(f"residual={row['residual']!s:>5} {path:>8} {us:8.2f} us{pct}", flush=True)
    for residual in (True, False):
        by_path = {r["path"]: r["us"] for r in rows if r["residual"] == residual}
        if "fused" in by_path and "unfused" in by_path:
            saved = by_path["unfused"] - by_path["fused"]
            print(f"residual={residual!s:>5}: fused saves {saved:.2f} us a call")
    return 0


if __name__ == "__main__":
    sys.exit(run_main(main))
