#!/usr/bin/env bash
# Forty-sixth run, calls 188-189 on one H100 (carry [".devrun"]): the GPU test of the 512-wide
# unrolled gate/up steps (GPU_BLOCKS' `dict(block_k=512)`: at H 2304 four whole steps and a
# masked half one) against the fp64 reference. Call 188 ran the whole
# test_triton_kimi_linear_shapes_on_gpu set but kept no log (its PASSED count grep read a
# quiet run's output: 0); call 189 ran the new entry's six cases (call189_gemv512_tests.log).
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .devrun/xd/*.whl
export PYTHONPATH=/tmp/site:$PWD
timeout 100 python -m pytest -q -m gpu -p no:cacheprovider -rf --tb=short -W ignore -n 4 \
  tests/model_executor/test_fused_moe.py -k "test_triton_kimi_linear_shapes_on_gpu and blocks2" \
  > $OUT/t.log 2>&1
echo rc $?; tail -5 $OUT/t.log
