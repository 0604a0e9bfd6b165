#!/usr/bin/env bash
# Device call 55: loads issued before barriers / conversions (GEMV x and scales, MoE gate/up x
# tile, norm weight, MLA cache write): kernel benchmarks against the old files, GPU tests.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl .devrun/xd/*.whl
export PYTHONUNBUFFERED=1
L=$OUT/logs; mkdir -p $L
rm -rf /tmp/base && mkdir /tmp/base && tar cf - --exclude=.git . | tar xf - -C /tmp/base && cp -r .devrun/base/vllm /tmp/base/
MOE="--paths triton --tokens 1 2 --fused-shared-experts 1 --triton-configs 8,256,4u/1,1024,1 4,256,4u/1,1024,1 8,512,4u/1,1024,1 4,512,4u/1,1024,1 16,256,8u/1,1024,1 8,256,8u/1,1024,1 4,1024,4u/1,1024,1"
GEMV="--dtypes fp8 bf16 --shapes o_proj --m 1 2 --configs default 2,4096,4,1,1 2,2048,4,1,1 4,4096,4,1,1 1,4096,2,1,1"
for round in 1 2; do
  for tree in new base; do
    dir=$PWD; [ $tree = base ] && dir=/tmp/base
    (cd $dir && PYTHONPATH=/tmp/site:$dir timeout 120 python benchmarks/kernels/benchmark_moe.py $MOE >> $L/call55_moe_$tree.log 2>&1; echo "moe $tree $round rc $?" >> $L/rc.txt)
    (cd $dir && PYTHONPATH=/tmp/site:$dir timeout 90 python benchmarks/kernels/benchmark_gemv.py $GEMV >> $L/call55_gemv_$tree.log 2>&1; echo "gemv $tree $round rc $?" >> $L/rc.txt)
  done
done
export PYTHONPATH=/tmp/site:$PWD
timeout 150 python -m pytest -q -m gpu -p no:cacheprovider tests/kernels/linear/test_gemv.py \
  tests/model_executor/layers/ops/test_rms_norm.py tests/models/kimi_k3/test_amd_mla_cache_write.py \
  > $L/call55_gpu_tests.log 2>&1
echo "tests rc $?" >> $L/rc.txt; pkill -f pytest
timeout 100 python -m pytest -q -m gpu -p no:cacheprovider tests/model_executor/test_fused_moe.py -k "test_triton_kimi_linear_shapes_on_gpu or cuda_graph" \
  > $L/call55_gpu_tests_moe.log 2>&1
echo "moe tests rc $?" >> $L/rc.txt; pkill -f pytest
cd $OUT && tar czf logs.tgz logs && rm -rf logs
