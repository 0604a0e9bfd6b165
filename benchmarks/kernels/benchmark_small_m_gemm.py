"""Benchmark the small-M GEMMs against the vendor GEMMs they replace, at Kimi-Linear decode shapes,
and print the M thresholds the dispatch should use (issue 12).

Providers, timed in one run on the same inputs:
  fp8_triton     fp8_small_m_gemm, default launch config (M <= MAX_M only)
  fp8_scaled_mm  rowwise torch._scaled_mm, as RowWiseTorchFP8ScaledMMLinearKernel calls it
  bf16_triton    small_m_gemm, default launch config (M <= MAX_M only)
  bf16_linear    F.linear (cuBLAS)
Shapes (K -> N): o_proj 4096 -> 2304 (KDA's and MLA's: 32 heads x 128 -> hidden), hidden_to_4096
2304 -> 4096 (one of KDA's q/k/v), MLA kv_b 512 -> 8192, all FP8 and bf16; the LM head
2304 -> 163840, bf16 only.

Each call reads the next of `--rotate` (16) distinct copies of the weight, so L2 (50 MB on an H200)
cannot hold them; the activation is the same (it was just written, as in a real step). Timed as
replays of one CUDA graph of `--rotate` calls (`time_graph` of
benchmark_rmsnorm_gated_fp8_per_token), which is what a decode step pays. Reports microseconds per
call, GB/s on the weight bytes read and that as a percent of an eager `copy_` bandwidth (read +
written bytes of 1 GiB, bench_utils.copy_gbps) measured in the same run.

Thresholds: per shape, the largest measured M at which the Triton kernel beats its baseline at that
M and at every smaller one; the suggestion for FP8_SMALL_M_THRESHOLD / BF16_SMALL_M_THRESHOLD
(vllm/model_executor/kernels/linear/small_m_gemm.py) is the smallest over the shapes.
`--sweep` instead times a grid of launch configs of fp8_triton and prints the fastest per case.

    python benchmarks/kernels/benchmark_small_m_gemm.py --output-json small_m.json
    python benchmarks/kernels/benchmark_small_m_gemm.py --sweep --sweep-m 1 16 32
    python benchmarks/kernels/benchmark_small_m_gemm.py --dry-run   # CPU, tiny shapes
"""

import argparse
import itertools
import json
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from benchmark_rmsnorm_gated_fp8_per_token import time_graph, write_csv
from triton.runtime.errors import OutOfResources

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/, for bench_utils
from bench_utils import copy_gbps, median_seconds  # noqa: E402

from vllm.model_executor.kernels.linear.scaled_mm.pytorch import (  # noqa: E402
    RowWiseTorchFP8ScaledMMLinearKernel,
)
from vllm.model_executor.kernels.linear.scaled_mm.ScaledMMLinearKernel import (  # noqa: E402
    FP8ScaledMMLinearLayerConfig,
)
from vllm.model_executor.kernels.linear.small_m_gemm import (  # noqa: E402
    MAX_M,
    SmallMGemmConfig,
    default_config,
    fp8_small_m_gemm,
    small_m_gemm,
)
from vllm.model_executor.layers.quantization.utils.quant_utils import (  # noqa: E402
    kFp8DynamicTokenSym,
    kFp8StaticChannelSym,
)
from vllm.platforms import current_platform  # noqa: E402

M_VALUES = [1, 2, 4, 8, 16, 32, 64, 128, 256]
FP8_PROVIDERS = ("fp8_triton", "fp8_scaled_mm")
BF16_PROVIDERS = ("bf16_triton", "bf16_linear")


@dataclass(frozen=True)
class Shape:
    name: str
    k: int
    n: int
    fp8: bool  # also time the FP8 providers


SHAPES = [
    Shape("o_proj", 4096, 2304, True),
    Shape("hidden_to_4096", 2304, 4096, True),
    Shape("mla_kv_b", 512, 8192, True),
    Shape("lm_head", 2304, 163840, False),
]
DRY_RUN_SHAPES = [Shape("tiny", 96, 80, True), Shape("tiny_head", 64, 300, False)]
DRY_RUN_M = [1, 3, MAX_M + 1]


class Weights:
    """`copies` distinct weights of one shape: FP8 codes [N, K] with scales [N, 1], and bf16."""

    def __init__(self, shape: Shape, copies: int, device: torch.device) -> None:
        gen = torch.Generator(device=device).manual_seed(0)
        fp8 = current_platform.fp8_dtype()
        self.bf16 = [
            torch.randn(shape.n, shape.k, generator=gen, device=device, dtype=torch.bfloat16)
            for _ in range(copies)
        ]
        self.fp8 = []
        if shape.fp8:
            for w in self.bf16:
                scale = w.abs().amax(dim=1, keepdim=True).float() / current_platform.fp8_max()
                self.fp8.append(((w.float() / scale).to(fp8), scale))
        self.next = 0

    def take(self) -> int:
        """The index of the weight the next call reads (advanced per call: each captured call of
        a graph reads its own copy)."""
        i = self.next
        self.next = (i + 1) % len(self.bf16)
        return i


def providers(shape: Shape, m: int, weights: Weights, device) -> dict[str, Callable[[], object]]:
    gen = torch.Generator(device=device).manual_seed(m)
    x = torch.randn(m, shape.k, generator=gen, device=device, dtype=torch.bfloat16)
    fns: dict[str, Callable[[], object]] = {}
    if shape.fp8:
        fp8 = current_platform.fp8_dtype()
        xs = x.float().abs().amax(dim=1, keepdim=True) / current_platform.fp8_max()
        xq = (x.float() / xs).to(fp8)
        rowwise = RowWiseTorchFP8ScaledMMLinearKernel(
            FP8ScaledMMLinearLayerConfig(kFp8DynamicTokenSym, kFp8StaticChannelSym,
                                         (shape.n, shape.k), torch.bfloat16, torch.bfloat16)
        )  # fmt: skip

        def fp8_scaled_mm():
            wq, ws = weights.fp8[weights.take()]
            return rowwise.apply_scaled_mm(xq, wq.t(), torch.bfloat16, xs, ws, None)

        if m <= MAX_M:
            fns["fp8_triton"] = lambda: fp8_small_m_gemm(xq, xs, *weights.fp8[weights.take()])
        fns["fp8_scaled_mm"] = fp8_scaled_mm
    if m <= MAX_M:
        fns["bf16_triton"] = lambda: small_m_gemm(x, weights.bf16[weights.take()])
    fns["bf16_linear"] = lambda: F.linear(x, weights.bf16[weights.take()])
    return fns


def timer(args, device) -> Callable[[Callable[[], object]], float]:
    """Microseconds per call: CUDA-graph replay of `--rotate` calls on a GPU, eager on CPU."""
    if device.type == "cuda":
        return lambda fn: time_graph(fn, args.rotate, reps=args.reps)
    return lambda fn: median_seconds(fn, device, reps=3) * 1e6


def suggested_threshold(times: dict[int, dict[str, float]], new: str, old: str) -> int:
    """The largest M at which `new` beats `old` there and at every smaller measured M (0: never)."""
    best = 0
    for m in sorted(times):
        if new not in times[m] or times[m][new] >= times[m][old]:
            break
        best = m
    return best


def run_table(args, device, copy: float) -> dict[str, object]:
    shapes = DRY_RUN_SHAPES if args.dry_run else [s for s in SHAPES if s.name in args.shapes]
    m_values = DRY_RUN_M if args.dry_run else args.m
    time_us = timer(args, device)
    rows: list[dict[str, object]] = []
    thresholds: dict[str, dict[str, int]] = {"fp8": {}, "bf16": {}}
    for shape in shapes:
        weights = Weights(shape, args.rotate, device)
        mb = shape.n * shape.k / 1e6
        print(f"# {shape.name}: K={shape.k} -> N={shape.n}, weight {mb:.1f} MB FP8 / "
              f"{2 * mb:.1f} MB bf16; columns: us, GB/s, % of copy", flush=True)  # fmt: skip
        names = (FP8_PROVIDERS if shape.fp8 else ()) + BF16_PROVIDERS
        print(f"{'M':>4} " + " ".join(f"{name:>24}" for name in names))
        times: dict[int, dict[str, float]] = {}
        for m in m_values:
            times[m] = {}
            cells = []
            fns = providers(shape, m, weights, device)
            for name in names:
                fn = fns.get(name)
                if fn is None:
                    cells.append(f"{'-':>24}")
                    continue
                us = time_us(fn)
                weight_bytes = shape.n * shape.k * (1 if name.startswith("fp8") else 2)
                gbps = weight_bytes / us / 1e3
                times[m][name] = us
                rows.append(dict(shape=shape.name, K=shape.k, N=shape.n, M=m, provider=name,
                                 us=round(us, 3), weight_GBps=round(gbps, 1),
                                 pct_copy=round(100 * gbps / copy, 1)))  # fmt: skip
                cells.append(f"{us:9.2f} {gbps:7.0f} {100 * gbps / copy:5.1f}%")
            print(f"{m:>4} " + " ".join(cells), flush=True)
        if shape.fp8:
            thresholds["fp8"][shape.name] = suggested_threshold(times, *FP8_PROVIDERS)
        thresholds["bf16"][shape.name] = suggested_threshold(times, *BF16_PROVIDERS)
        del weights
        if device.type == "cuda":
            torch.cuda.empty_cache()
    suggested = {kind: min(per.values()) for kind, per in thresholds.items() if per}
    print("# crossover M per shape (Triton faster at every M up to it): " + json.dumps(thresholds))
    print(f"# suggested FP8_SMALL_M_THRESHOLD = {suggested.get('fp8')}, BF16_SMALL_M_THRESHOLD = "
          f"{suggested.get('bf16')} (0: keep the vendor GEMM)")  # fmt: skip
    return dict(rows=rows, thresholds=thresholds, suggested=suggested)


def sweep_case(shape: Shape, m: int, weights: Weights, device, grid, time_us) -> list[dict]:
    """fp8_triton at every config of `grid` for one (shape, M); prints the five fastest."""
    gen = torch.Generator(device=device).manual_seed(m)
    x = torch.randn(m, shape.k, generator=gen, device=device, dtype=torch.bfloat16)
    xs = x.float().abs().amax(dim=1, keepdim=True) / current_platform.fp8_max()
    xq = (x.float() / xs).to(current_platform.fp8_dtype())
    default = default_config(m, shape.n, shape.k, xq.dtype, device)

    def call(config: SmallMGemmConfig) -> Callable[[], object]:
        return lambda: fp8_small_m_gemm(xq, xs, *weights.fp8[weights.take()], config=config)

    results = []
    for bn, bk, split, stages in grid:
        try:
            results.append((time_us(call(SmallMGemmConfig(bn, bk, split, 4, stages))),
                            (bn, bk, split, 4, stages)))  # fmt: skip
        except OutOfResources:  # too much shared memory for this GPU: not a candidate
            continue
    results.sort(key=lambda r: r[0])
    default_us = time_us(call(default))
    print(f"# {shape.name} M={m}: (block_n, block_k, split_k, num_warps, num_stages) default "
          f"{tuple(default)} {default_us:.2f} us; fastest of {len(results)}:")  # fmt: skip
    for us, config in results[:5]:
        print(f"    {us:8.2f} us  {config}")
    rows = [dict(shape=shape.name, M=m, us=round(us, 3), default=False,
                 **SmallMGemmConfig(*config)._asdict()) for us, config in results]  # fmt: skip
    rows.append(dict(shape=shape.name, M=m, us=round(default_us, 3), default=True,
                     **default._asdict()))  # fmt: skip
    return rows


def run_sweep(args, device) -> dict[str, object]:
    """Time a grid of fp8_triton launch configs per (shape, M)."""
    shapes = DRY_RUN_SHAPES[:1] if args.dry_run else [s for s in SHAPES if s.name in args.shapes]
    m_values = DRY_RUN_M[:2] if args.dry_run else args.sweep_m
    grid = list(itertools.product((16, 32, 64), (128, 256, 512), (1, 2, 4, 8), (3, 4)))
    if args.dry_run:
        grid = grid[:2]
    time_us = timer(args, device)
    rows: list[dict[str, object]] = []
    for shape in (s for s in shapes if s.fp8):
        weights = Weights(shape, args.rotate, device)
        for m in m_values:
            rows += sweep_case(shape, m, weights, device, grid, time_us)
    return dict(rows=rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--m", type=int, nargs="+", default=M_VALUES, help="M (tokens) values")
    parser.add_argument("--shapes", nargs="+", default=[s.name for s in SHAPES],
                        choices=[s.name for s in SHAPES])  # fmt: skip
    parser.add_argument("--rotate", type=int, default=16, help="distinct weight copies (16)")
    parser.add_argument("--reps", type=int, default=30, help="graph replays per timing")
    parser.add_argument("--copy-gib", type=float, default=1.0, help="size of the copy_ ceiling")
    parser.add_argument("--sweep", action="store_true", help="time fp8_triton launch configs")
    parser.add_argument("--sweep-m", type=int, nargs="+", default=[1, 16, 32])
    parser.add_argument("--dry-run", action="store_true", help="CPU, tiny shapes (a smoke test)")
    parser.add_argument("--output-json", help="write the results to this JSON file")
    parser.add_argument("--csv", help="write the rows to this CSV file")
    args = parser.parse_args(argv)
    if args.dry_run:
        device = torch.device("cpu")
        args.rotate, args.copy_gib = 2, 1 / 64
    elif torch.cuda.is_available():
        device = torch.device("cuda")
    else:
        parser.error("this benchmark measures a GPU: run it on one, or use --dry-run on the CPU")

    start = time.perf_counter()
    name = torch.cuda.get_device_name(0) if device.type == "cuda" else "cpu"
    print(f"# {name}, torch {torch.__version__}")
    with torch.inference_mode():
        copy = copy_gbps(args.copy_gib, device)
        print(f"# eager copy_ bandwidth {copy:.0f} GB/s (read + write of {args.copy_gib} GiB)")
        result = run_sweep(args, device) if args.sweep else run_table(args, device, copy)
    result.update(device=name, copy_gbps=round(copy, 1), seconds=round(time.perf_counter() - start))
    print(f"# {result['seconds']} s")
    if args.output_json:
        Path(args.output_json).write_text(json.dumps(result, indent=1))
    write_csv(args.csv, result["rows"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
