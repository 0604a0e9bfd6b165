#!/usr/bin/env bash
# Forty-sixth run, call 185, any GPU (carry [".whl", ".devrun"]): the GEMV path's new defaults
# (8,512,4u/1,I,1 at every token count). The GPU tests of moe_experts_triton; the new defaults
# against the old (8,256,4u/1,I,1 at one token, 8,256,4/2,I,2 above) at the engine's rows (the
# fused shared expert: top-8 + 1, top-16 + 1), each timed twice, interleaved; then the GEMV path
# against the grouped Triton path at 2-8 tokens, to see where TRITON_MAX_ROWS (32) should be.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl .devrun/xd/*.whl
export PYTHONPATH=/tmp/site:$PWD
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
timeout 150 python -m pytest -q -m gpu -p no:cacheprovider -rf --tb=short -W ignore -n 4 \
  tests/model_executor/test_fused_moe.py -k "test_triton_kimi_linear_shapes_on_gpu or fused_moe_forward" \
  > $OUT/gemv_tests.log 2>&1
echo "gemv tests rc $?"; tail -2 $OUT/gemv_tests.log
cd benchmarks/kernels
for T in 1 2 3; do
  timeout 60 python benchmark_moe.py --shape kimi-linear --fused-shared-experts 1 --paths triton \
    --tokens $T --triton-configs 8,512,4u/1,1024,1 8,256,4u/1,1024,1 8,256,4/2,1024,2 \
    8,512,4u/1,1024,1 8,256,4u/1,1024,1 8,256,4/2,1024,2 --csv $OUT/ab_kl_t$T.csv 2>&1 \
    | grep "T=" | cut -c1-96
done
for T in 1 2; do
  timeout 60 python benchmark_moe.py --shape kimi-k3-tp8 --fused-shared-experts 1 --paths triton \
    --activation situ --tokens $T --triton-configs 8,512,4u/1,512,1 8,256,4u/1,512,1 \
    8,256,4/2,512,2 8,512,4u/1,512,1 8,256,4u/1,512,1 8,256,4/2,512,2 --csv $OUT/ab_k3_t$T.csv \
    2>&1 | grep "T=" | cut -c1-96
done
timeout 90 python benchmark_moe.py --shape kimi-linear --fused-shared-experts 1 --paths triton tgrouped \
  --tokens 2 3 4 5 6 8 --csv $OUT/paths_kl.csv 2>&1 | grep "T=" | cut -c1-96
timeout 90 python benchmark_moe.py --shape kimi-k3-tp8 --fused-shared-experts 1 --paths triton tgrouped \
  --activation situ --tokens 1 2 3 4 --csv $OUT/paths_k3.csv 2>&1 | grep "T=" | cut -c1-96
