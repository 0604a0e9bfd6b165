#!/usr/bin/env bash
# Prepared in the forty-fourth run for the next device session (carry [".whl", ".devrun"]). One
# PART per call:
#   grid     (~9 min, an H200: needs_h200) the grid; last on an H200 in call 148;
#   moehist  (~2 min, after grid on the same H200) the default grouped tiles against 256-wide
#            down tiles on the engine's recorded routing (docs/perf_h200_2026-12-06d);
#   k3       (~5 min, any GPU) the KDA GPU tests on `fla_chunk_kda` (the refactor after the
#            last device call, not yet run on a GPU), then this run's Kimi-K3 paths on the H200
#            as well: fla-core's safe_gate path (benchmark_kda_prefill.py) and SiTU in the Triton
#            experts (benchmark_moe.py --activation situ), measured on an H100 in calls 171, 175,
#            and at Kimi-K3's TP-8 expert shapes (--shape kimi-k3-tp8, not measured yet).
set -u
case "${PART:-k3}" in
  grid|moehist)
    bash docs/perf_h200_2026-12-06d/next_calls.sh ;;
  k3)
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl .devrun/xd/*.whl
    export PYTHONPATH=/tmp/site:$PWD
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
    timeout 200 python -m pytest -q -m gpu -n 4 -p no:cacheprovider -rf --tb=short \
      tests/models/kimi_k3/test_amd_kda.py tests/models/kimi_k3/test_amd_kda_prefill_graphs.py \
      > $OUT/kda_tests.log 2>&1
    echo "kda tests rc $?"; grep -v "Warn\|warn" $OUT/kda_tests.log | tail -4
    cd benchmarks/kernels
    timeout 150 python benchmark_kda_prefill.py --tokens 1024 2048 8192 --heads 32 12 \
      --csv $OUT/kda_prefill.csv > $OUT/kda_prefill.log 2>&1
    echo "kda rc $?"; tail -7 $OUT/kda_prefill.log
    for A in situ silu; do
      timeout 80 python benchmark_moe.py --paths grouped triton tgrouped --activation $A \
        --tokens 1 2 8 64 256 --csv $OUT/moe_$A.csv > $OUT/moe_$A.log 2>&1
      echo "$A rc $?"; grep "T=" $OUT/moe_$A.log | cut -c1-120
    done
    # Kimi-K3's routed experts at TP 8 (896 of 3584 x 384, top-16), SiTU: not measured yet.
    timeout 80 python benchmark_moe.py --shape kimi-k3-tp8 --paths grouped triton tgrouped \
      --activation situ --tokens 1 2 8 64 --csv $OUT/moe_k3.csv > $OUT/moe_k3.log 2>&1
    echo "k3 rc $?"; grep "T=" $OUT/moe_k3.log | cut -c1-120 ;;
esac
