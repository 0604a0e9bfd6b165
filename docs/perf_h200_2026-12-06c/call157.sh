#!/usr/bin/env bash
# Forty-second run, call 157 (carry [".whl", ".devrun"]): call 156's two checks that ran past their
# limits on a fresh machine's compiles: the MoE GPU tests (0f63d96) with 300 s, and profile_check.py
# with the prefill graphs (c55301a's "Warmed up N prefill step sizes" line, 167402c's budget).
set -u
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl .devrun/xd/*.whl
export PYTHONPATH=/tmp/site:$PWD
timeout ${TLIMIT:-300} python -m pytest -q -m gpu -n 4 -p no:cacheprovider \
  tests/model_executor/test_fused_moe.py > $OUT/moe_tests.log 2>&1
echo "tests rc $?"; tail -3 $OUT/moe_tests.log
VLLM_KDA_PREFILL_GRAPHS=1 timeout 300 python docs/perf_h200_2026-12-06/profile_check.py \
  > $OUT/profile_1.log 2>&1
echo "profile rc $?"; grep -h "Captured\|Warmed\|Memory:\|KV cache:\|Error\|tokens " $OUT/profile_1.log | cut -c1-220
