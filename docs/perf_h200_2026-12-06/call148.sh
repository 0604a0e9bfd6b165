#!/usr/bin/env bash
# Fortieth run, call 148 (carry [".whl", ".devrun"]), on an H200: the whole grid
# (PART=grid of docs/perf_h200_2026-12-04e/next_calls.sh) on a fresh machine, this tree: the
# first grid with the KDA prefill core from CUDA graphs (20862cb) and the mixed-step warm-up
# (efce2cb). The start-up lines (mixed-step warm-up, prefill-graph capture with its memory, decode
# graphs, engine ready) come from the grid's log.
set -u
M=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1)
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
if [ "$M" -lt 100000 ]; then echo "not an H200: the 48B model does not fit"; exit 3; fi
PART=grid bash docs/perf_h200_2026-12-04e/next_calls.sh
grep -h "Warmed\|Captured\|engine ready\|warm-up (kernel\|Loaded" $OUT/grid.log | cut -c1-200
