#!/usr/bin/env bash
# Call 112: what a new prompt length costs in MLA's prefill attention (cuDNN's plan per shape?),
# then the GPU tests of the code changed since call 109 (grouped MoE prologue 663c12d, MLA
# metadata without a mask 28561f5, KDA gate hand-off 4b9a717). Carry [".whl", ".devrun"].
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl .devrun/xd/*.whl
export PYTHONPATH=/tmp/site:$PWD
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
for mode in default avoid_recompile flash; do
  timeout 120 python docs/perf_h200_2026-12-04d/sdpa_lengths.py $mode > $OUT/sdpa_$mode.log 2>&1
  echo "sdpa $mode rc $?"; cat $OUT/sdpa_$mode.log
done
timeout 330 python -m pytest -q -m gpu -n 4 -p no:cacheprovider --durations=8 \
  tests/model_executor/test_fused_moe.py tests/models/kimi_k3/test_amd_mla.py \
  tests/models/kimi_k3/test_amd_mla_prefill.py tests/models/kimi_k3/test_amd_mla_decode.py \
  tests/models/kimi_k3/test_amd_mla_cache_write.py tests/models/kimi_k3/test_amd_kda.py \
  tests/models/kimi_k3/test_amd_metadata.py > $OUT/gpu_tests.log 2>&1
echo "tests rc $?"; grep -v "Warning\|warner" $OUT/gpu_tests.log | tail -25
