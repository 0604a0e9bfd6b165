#!/usr/bin/env bash
# Forty-fourth run, call 175 (carry [".whl", ".devrun"]): Kimi-K3's SiTU in the Triton experts.
# 1. GPU tests: the GEMV and grouped Triton experts with SiLU and SiTU against the fp64 loop at
#    Kimi-Linear's expert shapes (bf16), and the SiTU selection.
# 2. benchmark_moe.py --activation situ (and silu beside it): torch's grouped GEMM (SiTU's path
#    on Hopper before) against the Triton paths, 1-256 tokens, graph replay.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl .devrun/xd/*.whl
export PYTHONPATH=/tmp/site:$PWD
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
timeout 200 python -m pytest -q -m gpu -n 4 -p no:cacheprovider -rf --tb=short \
  tests/model_executor/test_fused_moe.py -k "kimi_linear_shapes" > $OUT/gpu_tests.log 2>&1
echo "tests rc $?"; grep -v "Warn\|warn" $OUT/gpu_tests.log | tail -5
cd benchmarks/kernels
for A in situ silu; do
  timeout 120 python benchmark_moe.py --paths grouped triton tgrouped --activation $A \
    --tokens 1 2 8 64 256 --csv $OUT/moe_$A.csv > $OUT/moe_$A.log 2>&1
  echo "$A rc $?"; grep -v "^INFO" $OUT/moe_$A.log | grep "T=\|copy" | cut -c1-150 | head -20
done
