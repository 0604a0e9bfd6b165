#!/usr/bin/env bash
# Call 108: which warp-specialized forms of the grouped MoE kernels run, their bits and time.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl .devrun/xd/*.whl
export PYTHONPATH=/tmp/site:$PWD
timeout 480 python docs/perf_h200_2026-12-04d/ws_probe.py 2>&1 | tee $OUT/c108_ws.log
