#!/usr/bin/env bash
# Forty-sixth run, calls 181-184 on one H100 (carry [".whl", ".devrun"]), as they ran:
#   181  PART=gpu bash docs/perf_h200_2026-12-06f/next_calls.sh   (call181.sh: mla_tests.log,
#        moe_situ_tests.log, mla_prefill.*, k3_gemv_t2.*)
#   182  PART=ab8k LIMIT=160 bash docs/perf_h200_2026-12-06f/next_calls.sh   (ab8k/)
#   183, 184: the GEMV-path tiles below (k3_t*.csv, kl_t*.csv; k3b_t*.csv, klb_t*.csv).
set -u
export PYTHONPATH=/tmp/site:$PWD
cd benchmarks/kernels
# 183
for T in 2 4; do timeout 80 python benchmark_moe.py --shape kimi-k3-tp8 --paths triton --activation situ --tokens $T --triton-configs 8,256,4/2,512,2 8,256,4/1,512,1 16,256,4/1,512,1 8,512,4/1,512,1 16,256,4/2,512,2 8,256,4/2,512,2 --csv $OUT/k3_t$T.csv 2>&1 | grep "T=" | cut -c1-100; done
for T in 2 4; do timeout 80 python benchmark_moe.py --shape kimi-linear --paths triton --tokens $T --triton-configs 8,256,4/2,1024,2 8,256,4/1,1024,1 16,256,4/1,1024,1 16,256,4/2,1024,2 8,256,4/2,1024,2 --csv $OUT/kl_t$T.csv 2>&1 | grep "T=" | cut -c1-100; done
# 184
for T in 1 2 4 8; do timeout 80 python benchmark_moe.py --shape kimi-k3-tp8 --paths triton --activation situ --tokens $T --triton-configs 8,256,4u/1,512,1 8,512,4u/1,512,1 16,256,4u/1,512,1 8,512,4/1,512,1 16,512,4/1,512,1 16,256,8/1,512,1 8,512,4/2,512,2 8,256,4u/1,512,1 --csv $OUT/k3b_t$T.csv 2>&1 | grep "T=" | cut -c1-100; done
for T in 1 2 4 8; do timeout 80 python benchmark_moe.py --shape kimi-linear --paths triton --tokens $T --triton-configs 8,256,4u/1,1024,1 8,512,4u/1,1024,1 8,256,4/1,1024,1 8,512,4/1,1024,1 8,256,4/2,1024,2 8,256,4u/1,1024,1 --csv $OUT/klb_t$T.csv 2>&1 | grep "T=" | cut -c1-100; done
