#!/usr/bin/env bash
# Forty-sixth run, call 187, on call 186's machine (carry [".whl", ".devrun"]): the GPU tests of
# moe_experts_triton with block_k by H (call187_gemv_tests.log).
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .devrun/xd/*.whl .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD
timeout 110 python -m pytest -q -m gpu -p no:cacheprovider -rf --tb=short -W ignore -n 4 \
  tests/model_executor/test_fused_moe.py -k "test_triton_kimi_linear_shapes_on_gpu or fused_moe_forward" \
  > $OUT/gemv_tests.log 2>&1
echo rc $?; tail -2 $OUT/gemv_tests.log
