#!/usr/bin/env bash
# Device call 89: moe_one_launch_probe.py with the grid as the tile count (one gate/up and one
# down tile a program), against the production two launches, graph-timed.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl .devrun/xd/*.whl
L=$OUT/logs; mkdir -p $L
export PYTHONPATH=/tmp/site:$PWD
for i in 1; do
  timeout 240 python docs/perf_h200_2026-12-04/moe_one_launch_probe.py > $L/call89_moe_one_launch_$i.log 2>&1
  rc=$?; echo "probe $i rc $rc"; grep -v -i warn $L/call89_moe_one_launch_$i.log
  [ $rc -eq 0 ] || break
done
