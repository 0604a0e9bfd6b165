#!/usr/bin/env bash
# Device call 62: the KDA layer's GPU tests that calls 60 and 61 did not reach.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl .devrun/xd/*.whl
L=$OUT/logs; mkdir -p $L
PYTHONPATH=/tmp/site:$PWD timeout 330 python -m pytest -q -m gpu -p no:cacheprovider -rA tests/models/kimi_k3/test_amd_kda.py \
  --deselect "tests/models/kimi_k3/test_amd_kda.py::test_layer_matches_transformers_prefill_then_decode[conv4-cuda]" \
  --deselect "tests/models/kimi_k3/test_amd_kda.py::test_layer_matches_transformers_prefill_then_decode[conv3-cuda]" \
  > $L/call62_gpu_tests.log 2>&1
echo "tests rc $?"; pkill -f pytest
grep -E "PASSED|FAILED|ERROR|passed|failed" $L/call62_gpu_tests.log | tail -20
