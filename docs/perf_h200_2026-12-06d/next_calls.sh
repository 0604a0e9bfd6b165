#!/usr/bin/env bash
# Prepared in the forty-third run for the next device session (not run; carry [".whl",
# ".devrun"]). One PART per call:
#   grid     (~9 min)  the grid on an H200 (needs_h200: the 48B model does not fit an
#                      H100); not run since call 148 (fortieth run): the forty-first and
#                      forty-second runs' warm-up bands and host trims are in it now;
#   moehist  (~3 min)  the grouped experts on the engine's own routing: benchmark_moe.py
#                      --routing-histogram over the 26 layers the twenty-sixth run recorded from
#                      the 8k prefill (c101_hist_0.json), the default tiles and candidates, each
#                      summed over the layers, against the engine profile's routed experts (call
#                      123: 56.6 ms a prefill, gate/up at 58% of the peak). Any card (3.7 GB of
#                      expert weights); compare configs within one call only.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl .devrun/xd/*.whl
export PYTHONPATH=/tmp/site:$PWD
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
case "${PART:-moehist}" in
  grid)
    PART=grid bash docs/perf_h200_2026-12-06c/next_calls.sh ;;
  moehist)
    # The default (128-row blocks, 64-row tails, TMA), then: no tails, 32-row tails, three
    # gate/up stages, the 64-row blocks of 4096-32767 rows, and 128-wide down chunks.
    timeout 540 python benchmarks/kernels/benchmark_moe.py --paths tgrouped \
      --fused-shared-experts 1 --timing flushed \
      --routing-histogram docs/perf_h200_2026-12-04c/c101_hist_0.json \
      --tgrouped-configs 128+64/128,64,8,4/128,64,8,3/tma 128/128,64,8,4/128,64,8,3/tma \
        128+32/128,64,8,4/128,64,8,3/tma 128+64/128,64,8,3/128,64,8,3/tma \
        64/128,64,4,4/128,64,4,4/tma 128+64/128,64,8,4/128,128,8,3/tma \
      --csv $OUT/moehist.csv > $OUT/moehist.log 2>&1
    echo "moehist rc $?"; grep -v "^layer" $OUT/moehist.log | tail -12 ;;
esac
