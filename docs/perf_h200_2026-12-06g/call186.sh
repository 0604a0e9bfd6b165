#!/usr/bin/env bash
# Forty-sixth run, call 186, any GPU (carry [".whl", ".devrun"]): block_k by H (512 where it
# divides H, else 256), after call 185 found 512 slower at Kimi-Linear's H 2304 with the fused
# shared expert. The defaults ("triton") against explicit configs in one process, top-k + 1 rows;
# Kimi-K3 at two tokens in two processes (call 185's `paths_k3` took 110 us there with the
# defaults, its A/B process 94 us with the same blocks).
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD
cd benchmarks/kernels
for T in 1 2 3; do
  timeout 60 python benchmark_moe.py --shape kimi-linear --fused-shared-experts 1 --paths triton \
    --tokens $T --triton-configs 8,256,4u/1,1024,1 8,512,4u/1,1024,1 8,256,4/2,1024,2 \
    8,256,4u/1,1024,1 --csv $OUT/kl_t$T.csv 2>&1 | grep "T=" | cut -c1-96
  timeout 60 python benchmark_moe.py --shape kimi-linear --fused-shared-experts 1 --paths triton \
    --tokens $T 2>&1 | grep "T=" | cut -c1-96
done
for run in a b; do
  timeout 60 python benchmark_moe.py --shape kimi-k3-tp8 --fused-shared-experts 1 --paths triton \
    --activation situ --tokens 1 2 --triton-configs 8,512,4u/1,512,1 8,256,4/2,512,2 \
    --csv $OUT/k3_$run.csv 2>&1 | grep "T=" | cut -c1-96
  timeout 60 python benchmark_moe.py --shape kimi-k3-tp8 --fused-shared-experts 1 --paths triton \
    --activation situ --tokens 1 2 2>&1 | grep "T=" | cut -c1-96
done
