#!/usr/bin/env bash
# Device call 65: top-k selection algorithms by warps (experiment), KDA decode launch variants at
# batch 1 and 8 on the current kernel, MLA decode launch configs at batch 1 (1k as in the engine).
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl .devrun/xd/*.whl
L=$OUT/logs; mkdir -p $L
export PYTHONPATH=/tmp/site:$PWD
timeout 150 python .devrun/exp_topk.py > $L/call65_topk.log 2>&1; echo "topk rc $?"; cat $L/call65_topk.log | grep -v -i warn
timeout 200 python benchmarks/kernels/benchmark_kda_decode.py --shapes kimi-linear --quantize --batches 1 8 \
  --no-compare --variants v16w4 v16w2 v16w1 v8w1 v8w2 v8w4 v32w2 v32w4 v64w4 v64w4x > $L/call65_kda.log 2>&1
echo "kda rc $?"; grep -v -i warn $L/call65_kda.log | tail -6
timeout 200 python benchmarks/kernels/benchmark_mla_decode.py --batches 1 --contexts 1034 --capacity 1066 \
  --block-size 16 --configs 16,64,8,5,c4 16,64,4,5,c4 16,64,4,3 16,32,4,3 16,32,4,2 16,32,8,2 32,64,8,5,c4 \
  --splits 9 16 17 32 --merge two > $L/call65_mla.log 2>&1
echo "mla rc $?"; grep -v -i warn $L/call65_mla.log | tail -30
