#!/usr/bin/env bash
# Thirty-sixth run, call 135 (carry [".whl", ".devrun"]; fits an H100). The routed experts at
# prefill sizes are compute-bound (~62% of the matmul peak at 8192 tokens): wider down tiles
# (128 x 256, 8 warps, the usual Hopper wgmma shape) and a deeper down K step against the default,
# one layer, L2 flushed, with torch._grouped_mm beside them.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
D=128+64/128,64,8,4
timeout ${LIMIT:-500} python benchmarks/kernels/benchmark_moe.py --paths grouped tgrouped \
  --tokens 8192 4096 2048 --fused-shared-experts 1 --timing flushed --csv $OUT/moe_tiles.csv \
  --tgrouped-configs $D/128,64,8,3/tma $D/256,64,8,3/tma $D/256,64,8,4/tma $D/128,128,8,3/tma \
  128+64/128,64,8,3/256,64,8,3/tma $D/256,32,8,4/tma > $OUT/moe_tiles.log 2>&1
echo "moe rc $?"; grep -v "^INFO" $OUT/moe_tiles.log | tail -40
