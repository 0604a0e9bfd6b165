#!/usr/bin/env bash
# Device call 76: side-stream L2 prefetch probe (docs/perf_h200_2026-12-03e/l2_prefetch_probe.py).
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
L=$OUT/logs; mkdir -p $L
export PYTHONPATH=/tmp/site:$PWD
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
timeout 400 python docs/perf_h200_2026-12-03e/l2_prefetch_probe.py > $L/call76_l2_prefetch.log 2>&1
echo "probe rc $?"; grep -v -i warn $L/call76_l2_prefetch.log | tail -40
