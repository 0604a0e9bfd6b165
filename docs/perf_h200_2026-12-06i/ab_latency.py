"""benchmarks/benchmark_latency.py with the GEMV's one-row wide-tile bound taken from the
environment (`WIDE_MIN_N`, gemv_config.WIDE_TILE_MIN_N) before the engine is built, so that one
tree times both tile choices; run from the root of the tree to time, with the benchmark's
arguments."""

import os
import runpy
import sys

from vllm.model_executor.kernels.linear import gemv_config

if "WIDE_MIN_N" in os.environ:
    gemv_config.WIDE_TILE_MIN_N = int(os.environ["WIDE_MIN_N"])
sys.argv = ["benchmarks/benchmark_latency.py", *sys.argv[1:]]
sys.path.insert(0, "benchmarks")  # the script's own directory, as `python benchmarks/...` has it
runpy.run_path("benchmarks/benchmark_latency.py", run_name="__main__")
