#!/usr/bin/env bash
# Device call 50: GPU tests of the PDL tree; GEMV and fused-router kernel benchmarks for three
# variants: no PDL (VLLM_TRITON_PDL=0), PDL without the weight prefetch (aa61e88's three files),
# PDL with it (HEAD).
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl .devrun/xd/*.whl
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site:$PWD
L=$OUT/logs; mkdir -p $L
ROOT=$PWD
timeout 230 python -m pytest -q -m gpu -p no:cacheprovider tests/v1/worker/test_cuda_graphs.py \
  tests/model_executor/test_fused_moe.py::test_triton_grouped_tma_past_the_tensors_on_gpu \
  tests/models/kimi_k3/test_amd_kda_oproj_ptpc.py > $L/call50_gpu_tests.log 2>&1
echo "tests rc $?" >> $L/rc.txt; pkill -f pytest
cp -r $ROOT /tmp/vpdl && cp -r .devrun/pdlonly/vllm /tmp/vpdl/
bench() {  # tree tag pdl
  cd $1 && export PYTHONPATH=/tmp/site:$1
  VLLM_TRITON_PDL=$3 timeout 45 python benchmarks/kernels/benchmark_gemv.py --dtypes fp8 bf16 --shapes o_proj \
    --m 1 2 4 > $L/call50_gemv_$2.log 2>&1
  echo "gemv $2 rc $?" >> $L/rc.txt
  VLLM_TRITON_PDL=$3 timeout 35 python benchmarks/kernels/benchmark_router.py --fused-norm --tokens 1 \
    > $L/call50_router_$2.log 2>&1
  echo "router $2 rc $?" >> $L/rc.txt
}
bench $ROOT prefetch 1
bench /tmp/vpdl pdlonly 1
bench $ROOT nopdl 0
cd $OUT && tar czf logs.tgz logs && rm -rf logs
