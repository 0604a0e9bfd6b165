#!/usr/bin/env bash
# Device call 106: the GPU test of the KDA core applying the gate in fla-core (both gate forms),
# then the layer against transformers (prefill, then decode), as far as the time allows.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl .devrun/xd/*.whl
export PYTHONPATH=/tmp/site:$PWD
timeout 140 python -m pytest -q -m gpu -p no:cacheprovider -rA tests/models/kimi_k3/test_amd_kda.py \
  -k "gate_itself or layer_matches_transformers" > $OUT/c106_tests.log 2>&1
echo "tests rc $?"; grep -E "^(PASSED|FAILED|ERROR)|passed|failed|^E " $OUT/c106_tests.log | head -20
