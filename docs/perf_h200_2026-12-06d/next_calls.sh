#!/usr/bin/env bash
# Prepared in the forty-third run for the next device session (not run; carry [".whl",
# ".devrun"]). One PART per call:
#   grid     (~9 min)  the grid on an H200 (needs_h200: the 48B model does not fit an
#                      H100); not run since call 148 (fortieth run): the forty-first and
#                      forty-second runs' warm-up bands and host trims are in it now;
#   moehist  (~2 min)  the grouped experts on the engine's own routing: benchmark_moe.py
#                      --routing-histogram over the 26 layers the twenty-sixth run recorded from
#                      the 8k prefill (c101_hist_0.json), the default tiles against the 256-wide
#                      down tiles that won 2.1% on an H100 (call 170), each summed over the
#                      layers, against the engine profile's routed experts (call 123: 56.6 ms a
#                      prefill). On the H200, after `grid` on the same machine; compare configs
#                      within one call only.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl .devrun/xd/*.whl
export PYTHONPATH=/tmp/site:$PWD
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
case "${PART:-moehist}" in
  grid)
    PART=grid bash docs/perf_h200_2026-12-06c/next_calls.sh ;;
  moehist)
    # The default (128-row blocks, 64-row tails, TMA) against 256-wide down tiles (3 and 4
    # stages: 2.1% faster on an H100 in call 170), alternating, all 26 layers.
    D=128+64/128,64,8,4/128,64,8,3/tma
    timeout 540 python benchmarks/kernels/benchmark_moe.py --paths tgrouped \
      --fused-shared-experts 1 --timing flushed \
      --routing-histogram docs/perf_h200_2026-12-04c/c101_hist_0.json \
      --tgrouped-configs $D 128+64/128,64,8,4/256,64,8,4/tma 128+64/128,64,8,4/256,64,8,3/tma \
      --csv $OUT/moehist.csv > $OUT/moehist.log 2>&1
    echo "moehist rc $?"; grep -v "^layer" $OUT/moehist.log | tail -12 ;;
esac
