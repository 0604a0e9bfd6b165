#!/usr/bin/env bash
# Fortieth run, call 149 (carry [".whl", ".devrun"]; after call 148 on the same warm machine):
# 1. the GPU tests of the KDA prefill graphs and of the runner's CUDA graphs (the thirty-ninth
#    run's review fixes had not run on a GPU);
# 2. profile_check.py with the graphs on and off: cache sizing with the profiling forward (replays
#    off while it runs), the capture's memory line, the same greedy tokens;
# 3. call145.sh's A/B on the whole 48B model (H200): one prompt of 1k / 2k / 8k with the KDA
#    prefill core from graphs and eager.
set -u
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl .devrun/xd/*.whl
export PYTHONPATH=/tmp/site:$PWD
timeout ${TLIMIT:-200} python -m pytest -q -m gpu -p no:cacheprovider -rA \
  tests/models/kimi_k3/test_amd_kda_prefill_graphs.py tests/v1/worker/test_cuda_graphs.py \
  > $OUT/tests.log 2>&1
echo "tests rc $?"; grep -E "^(PASSED|FAILED|ERROR)|passed|failed" $OUT/tests.log | tail -20
for G in 1 0; do
  VLLM_KDA_PREFILL_GRAPHS=$G timeout 90 python docs/perf_h200_2026-12-06/profile_check.py \
    > $OUT/profile_$G.log 2>&1
  echo "profile graphs=$G rc $?"
  grep -h "Captured\|Memory:\|KV cache:\|VLLM_KDA\|Error" $OUT/profile_$G.log | cut -c1-220
done
LIMIT=${ABLIMIT:-130} LENGTHS="1024 2048 8192" REPS=${REPS:-3} bash docs/perf_h200_2026-12-05h/call145.sh
