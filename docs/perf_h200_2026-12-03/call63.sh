#!/usr/bin/env bash
# Device call 63: GPU tests of the GEMV and the router on the final code (review fixes), and the
# KDA decode kernel benchmark at batch 128 (the batch the engine sweep skips).
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl .devrun/xd/*.whl
L=$OUT/logs; mkdir -p $L
export PYTHONPATH=/tmp/site:$PWD
timeout 150 python -m pytest -q -m gpu -p no:cacheprovider tests/kernels/linear/test_gemv.py \
  tests/model_executor/layers/fused_moe/test_fused_router.py > $L/call63_gpu_tests.log 2>&1
echo "tests rc $?"; pkill -f pytest
tail -3 $L/call63_gpu_tests.log
timeout 60 python benchmarks/kernels/benchmark_kda_decode.py --shapes kimi-linear --quantize --batches 128 \
  --no-compare --variants v64w4 v64w4x > $L/call63_kda_128.log 2>&1
echo "kda rc $?"; grep -v Warn $L/call63_kda_128.log | grep -v warn_once
