#!/usr/bin/env bash
# Prepared in the forty-second run for the next device session (not run; carry [".whl",
# ".devrun"]). One PART per call, a fresh machine's compiles counted in each limit:
#   tests (~6 min)  the MoE, launch and worker GPU tests on this tree: the grouped experts
#                   through `launch` (TMA descriptors on its fast path; not yet run on a GPU),
#                   59e5d80's grids and cached tile checks, e928996's warm-up with a given
#                   budget, the start-up bars, f92db39's conv into the prefill graphs' q, k, v
#                   buffers (the engine's prefill-graph test); run it first;
#   host  (~4 min)  the 1k prompt under the profiler (call159.sh, one process): the gaps around
#                   the MoE blocks against call 159's (top-k -> grouping 162 us a layer, grouping
#                   -> gate/up 142, norm -> router GEMV 102, router -> top-k 75; H100, 128
#                   experts), and e928996's "Warmed up N prefill step sizes" line in a benchmark
#                   engine (kv_cache_memory set);
#   grid  (~9 min)  the grid on an H200 (the 48B model does not fit an H100).
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl .devrun/xd/*.whl
export PYTHONPATH=/tmp/site:$PWD
case "${PART:-tests}" in
  tests)
    timeout 540 python -m pytest -q -m gpu -n 4 -p no:cacheprovider \
      tests/model_executor/test_fused_moe.py tests/triton_utils tests/v1/worker \
      tests/models/kimi_k3/test_amd_kda_prefill_graphs.py \
      tests/models/kimi_k3/test_amd_causal_conv1d.py > $OUT/gpu_tests.log 2>&1
    echo "tests rc $?"; tail -5 $OUT/gpu_tests.log ;;
  host)
    L2=1 bash docs/perf_h200_2026-12-06c/call159.sh
    grep -h "Warmed up\|engine ready" $OUT/q1.log | cut -c1-200
    grep -A10 "longer gaps by the kernels" $OUT/q1.log | cut -c1-200 ;;
  grid)
    PART=grid bash docs/perf_h200_2026-12-04e/next_calls.sh
    grep -h "Warmed\|Captured\|engine ready\|warm-up (kernel\|Loaded" $OUT/grid.log | cut -c1-200 ;;
esac
