#!/usr/bin/env bash
# Device call 104: the grouped experts' GPU tests that run the default prefill tiles (64-row tail
# tiles on the 128-row TMA tiles) against the pointer loads and the full tiles.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl .devrun/xd/*.whl
export PYTHONPATH=/tmp/site:$PWD
timeout 300 python -m pytest -q -m gpu -n 4 -p no:cacheprovider -rA tests/model_executor/test_fused_moe.py \
  -k "tail_tiles_on_gpu or tma_gives or tma_past or kimi_linear_shapes_on_gpu" > $OUT/c104_tests.log 2>&1
echo "tests rc $?"; grep -E "^(PASSED|FAILED|ERROR)|passed|failed" $OUT/c104_tests.log | cut -c1-160
