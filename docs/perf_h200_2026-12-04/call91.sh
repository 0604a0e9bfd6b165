#!/usr/bin/env bash
# Device call 91: the whole GPU test suite (pytest -m gpu, 4 xdist workers) on main (0d290e3's code).
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl .devrun/xd/*.whl
L=$OUT/logs; mkdir -p $L
export PYTHONPATH=/tmp/site:$PWD
timeout 540 python -m pytest -q -m gpu -n 4 -p no:cacheprovider --durations=20 tests > $L/call91_gpu_tests.log 2>&1
echo "tests rc $?"; grep -E "passed|failed|error" $L/call91_gpu_tests.log | tail -15
