#!/usr/bin/env bash
# Device call 79: the one-token MoE gate/up kernel with Triton-pipelined steps (moe_staged_probe.py).
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
L=$OUT/logs; mkdir -p $L
export PYTHONPATH=/tmp/site:$PWD
timeout 300 python docs/perf_h200_2026-12-03e/moe_staged_probe.py > $L/call79_moe_staged.log 2>&1
echo "probe rc $?"; grep -v -i warn $L/call79_moe_staged.log
