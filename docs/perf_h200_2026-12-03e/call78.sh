#!/usr/bin/env bash
# Device call 78: the per-kernel floor of a CUDA graph (graph_kernel_floor.py), then the whole GPU
# test suite (pytest -m gpu, 4 xdist workers).
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl .devrun/xd/*.whl
L=$OUT/logs; mkdir -p $L
export PYTHONPATH=/tmp/site:$PWD
timeout 60 python docs/perf_h200_2026-12-03e/graph_kernel_floor.py > $L/call78_graph_floor.log 2>&1
echo "floor rc $?"; grep -v -i warn $L/call78_graph_floor.log
timeout 470 python -m pytest -q -m gpu -n 4 -p no:cacheprovider --durations=30 tests > $L/call78_gpu_tests.log 2>&1
echo "tests rc $?"; grep -E "passed|failed|error" $L/call78_gpu_tests.log | tail -15
