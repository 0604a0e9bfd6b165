#!/usr/bin/env bash
# Call 107: the grouped down kernel warp-specialized (Triton 3.6's Hopper autoWS) against its
# current launch, one MoE layer at 8192 and 4096 tokens, L2 flushed.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl .devrun/xd/*.whl
export PYTHONPATH=/tmp/site:$PWD
G=128,64,8,4
timeout 500 python benchmarks/kernels/benchmark_moe.py --paths tgrouped --tokens 8192 4096 \
  --fused-shared-experts 1 --timing flushed --tgrouped-configs \
  128+64/$G/128,64,8,3/tma 128+64/$G/128,64,4,3/tma 128+64/$G/128,64,4,3/tmaws \
  128/128,64,4,3/128,64,4,3/tmaws2 128/128,64,4,4/128,64,4,3/tmaws2 128/128,64,4,3/128,64,8,3/tmawsg 128/128,64,8,4/128,64,8,3/tma \
  128+64/$G/128,64,4,4/tmaws 128+64/$G/256,64,8,3/tma 128+64/$G/128,64,8,3/tma \
  > $OUT/c107_moe.log 2>&1
echo "moe rc $?"; cat $OUT/c107_moe.log | grep -v "^ *$" | tail -30
