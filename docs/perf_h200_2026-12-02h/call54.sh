#!/usr/bin/env bash
# Device call 54: M = 1-2 GEMV configs (one K tile, 1 stage), alone and after a quant kernel.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl .devrun/xd/*.whl
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site:$PWD
L=$OUT/logs; mkdir -p $L
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem --format=csv > $L/gpu.txt 2>&1
timeout 300 python .devrun/exp_preload.py > $L/call54_gemv.log 2>&1
echo "exp rc $?" >> $L/rc.txt
cd $OUT && tar czf logs.tgz logs && rm -rf logs
