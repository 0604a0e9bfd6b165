#!/usr/bin/env bash
# Prepared in the forty-first run for the next device session (not run; carry [".whl", ".devrun"];
# an H200: the 48B model does not fit an H100). In one call on a fresh machine, ~9 min:
# 1. the MoE GPU tests (0f63d96: the chunked grouping's placing kernel without its chunk-count and
#    table-width specialization; test_triton_grouped_kimi_linear_shapes_on_gpu runs it at 4096
#    tokens) and the engine benchmarks' dry runs on the GPU;
# 2. the grid (call148.sh's arguments) with the warm-up bands (c6a509b): the 1k batch
#    phase's steps should take ~130 ms (call 154) instead of ~347 (call 148), the warm-up longer;
# 3. profile_check.py with the graphs on: 167402c's profiled cache budget on a GPU, and the
#    profiling run's band warm-up (c55301a: its "Warmed up N prefill step sizes" line).
set -u
M=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1)
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
if [ "$M" -lt 100000 ]; then echo "not an H200: the 48B model does not fit"; exit 3; fi
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl .devrun/xd/*.whl
export PYTHONPATH=/tmp/site:$PWD
timeout ${TLIMIT:-150} python -m pytest -q -m gpu -n 4 -p no:cacheprovider \
  tests/model_executor/test_fused_moe.py > $OUT/moe_tests.log 2>&1
echo "tests rc $?"; tail -3 $OUT/moe_tests.log
PART=grid bash docs/perf_h200_2026-12-04e/next_calls.sh
grep -h "Warmed\|Captured\|engine ready\|warm-up (kernel\|Loaded" $OUT/grid.log | cut -c1-200
VLLM_KDA_PREFILL_GRAPHS=1 timeout 90 python docs/perf_h200_2026-12-06/profile_check.py \
  > $OUT/profile_1.log 2>&1
echo "profile rc $?"; grep -h "Captured\|Warmed\|Memory:\|KV cache:\|Error" $OUT/profile_1.log | cut -c1-220
