#!/usr/bin/env bash
# Prepared in the forty-sixth run for the next device session (carry [".whl", ".devrun"]). One
# PART per call:
#   grid   (~9 min, an H200: needs_h200) the grid, last on an H200 in call 148; now with
#          the forty-fifth run's MLA operands and 256-wide down tiles and this run's GEMV tiles;
#   gemv   (~3 min, any GPU; on the H200 after `grid` on the same machine) the GEMV experts'
#          defaults against the old ones at the engine's rows (Kimi-Linear: top-8 + the fused
#          shared expert; Kimi-K3: top-16, its latent MoE keeps the shared expert apart) on the
#          GPU the defaults are for; Kimi-K3's two tokens, which took 92-94 us in a process that
#          timed them alone but 109-112 where one token's case ran first (calls 183-186): two
#          tokens twice in one process, then after one token, then alone; and the GEMV path
#          against the grouped one at 3-8 Kimi-Linear tokens and 2-4 Kimi-K3 tokens, one process
#          per count, for TRITON_MAX_ROWS (32 rows; call 185 had the GEMV path ahead up to 54
#          Kimi-Linear rows and 51 Kimi-K3 rows, Kimi-K3 at 3 tokens by 1.23x).
set -u
case "${PART:-gemv}" in
  grid) PART=grid bash docs/perf_h200_2026-12-06c/next_calls.sh ;;
  gemv)
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
    export PYTHONPATH=/tmp/site:$PWD
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
    cd benchmarks/kernels
    for T in 1 2 3; do
      timeout 60 python benchmark_moe.py --shape kimi-linear --fused-shared-experts 1 \
        --paths triton --tokens $T --triton-configs default 8,256,4/2,1024,2 \
        8,512,4u/1,1024,1 default --csv $OUT/kl_t$T.csv 2>&1 | grep "T=" | cut -c1-96
    done
    for tokens in "2 2" "1 2" "2"; do
      timeout 60 python benchmark_moe.py --shape kimi-k3-tp8 --paths triton --activation situ \
        --tokens $tokens --triton-configs default 8,256,4/2,512,2 \
        --csv $OUT/k3_${tokens// /_}.csv 2>&1 | grep "T=" | cut -c1-96
    done
    for T in 3 4 5 6 7 8; do
      timeout 60 python benchmark_moe.py --shape kimi-linear --fused-shared-experts 1 \
        --paths triton tgrouped --tokens $T --csv $OUT/paths_kl_t$T.csv 2>&1 | grep "T=" | cut -c1-96
    done
    for T in 2 3 4; do
      timeout 60 python benchmark_moe.py --shape kimi-k3-tp8 --activation situ \
        --paths triton tgrouped --tokens $T --csv $OUT/paths_k3_t$T.csv 2>&1 | grep "T=" | cut -c1-96
    done ;;
esac
