#!/usr/bin/env bash
# Device call 92: the router's top-k by `tl.topk` (Triton's bitonic top-k) instead of a full sort
# of the 256 keys. Needs .devrun/router_base.py (the router.py before it, 5f6b6ea):
#   git show 5f6b6ea:vllm/model_executor/layers/fused_moe/router.py > .devrun/router_base.py
# 1. The router GPU tests on this tree.
# 2. benchmark_router.py, the fused norm + router at T = 1 and 8 and the standalone top-k kernel
#    at T = 1, 64, 256, on the base tree and this one, alternating (the fused one twice).
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl .devrun/xd/*.whl
L=$OUT/logs; mkdir -p $L
NEW=$PWD
rm -rf /tmp/vB && mkdir /tmp/vB && cp -r vllm benchmarks pyproject.toml /tmp/vB/
cp .devrun/router_base.py /tmp/vB/vllm/model_executor/layers/fused_moe/router.py
export PYTHONPATH=/tmp/site:$NEW
timeout 60 python -m pytest -q -m gpu -n 4 -p no:cacheprovider tests/model_executor/layers/fused_moe/test_fused_router.py \
  tests/model_executor/test_fused_moe.py -k "router or topk" > $L/call92_gpu_tests.log 2>&1
echo "tests rc $?"; tail -1 $L/call92_gpu_tests.log
fused() { # tree tag
  (cd $1 && PYTHONPATH=/tmp/site:$1 timeout 40 python benchmarks/kernels/benchmark_router.py --fused-norm \
    --tokens 1 8 > $L/call92_router_fused_$2.log 2>&1; echo "fused $2 rc $?"; grep -v -i warn $L/call92_router_fused_$2.log | tail -6)
}
topk() { # tree tag
  (cd $1 && PYTHONPATH=/tmp/site:$1 timeout 30 python benchmarks/kernels/benchmark_router.py \
    --tokens 1 64 256 > $L/call92_router_topk_$2.log 2>&1; echo "topk $2 rc $?"; grep -v -i warn $L/call92_router_topk_$2.log | tail -5)
}
fused /tmp/vB base1; fused $NEW new1; topk /tmp/vB base1; topk $NEW new1; fused /tmp/vB base2; fused $NEW new2
