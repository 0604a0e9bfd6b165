#!/usr/bin/env bash
# Device call 88: the one-token routed experts in one persistent launch (moe_one_launch_probe.py,
# then with grids of 1, 4 and 8 programs an SM; call 89's case list replaced them) against the
# production two launches, graph-timed.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl .devrun/xd/*.whl
L=$OUT/logs; mkdir -p $L
export PYTHONPATH=/tmp/site:$PWD
for i in 1 2; do
  timeout 240 python docs/perf_h200_2026-12-04/moe_one_launch_probe.py > $L/call88_moe_one_launch_$i.log 2>&1
  rc=$?; echo "probe $i rc $rc"; grep -v -i warn $L/call88_moe_one_launch_$i.log
  [ $rc -eq 0 ] || break
done
