#!/usr/bin/env bash
# Device call 49: PDL with the weight prefetch. GEMV kernel benchmark with PDL on / off; engine
# decode at batch 1 and 8, HEAD (PDL + prefetch) against aa61e88 (PDL only); GPU tests.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl .devrun/xd/*.whl
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site:$PWD
L=$OUT/logs; mkdir -p $L
ROOT=$PWD
PTPC='{"linear":"fp8_per_channel","ignore":["re:(?!.*self_attn\\.o_proj$).*"]}'
for p in 1 0; do
  VLLM_TRITON_PDL=$p timeout 60 python benchmarks/kernels/benchmark_gemv.py --dtypes fp8 bf16 --shapes o_proj \
    --m 1 2 4 16 --configs default > $L/call49_gemv_pdl$p.log 2>&1
  echo "gemv $p rc $?" >> $L/rc.txt
done
LAT="--model kimi-linear-48b-a3b --load-format dummy --skip-tokenizer-init --batch-sizes 1 8 --input-lens 1024 --output-len 16 --warmup-steps 2 --profile-steps 2 --max-num-batched-tokens 8192"
timeout 190 python benchmarks/benchmark_latency.py $LAT --quantization-config "$PTPC" \
  --output-json $L/call49_latency_new.json > $L/call49_latency_new.log 2>&1
echo "new rc $?" >> $L/rc.txt
cp -r $ROOT /tmp/vbase && cd /tmp/vbase && git checkout -q aa61e88 -- vllm && export PYTHONPATH=/tmp/site:/tmp/vbase
timeout 90 python benchmarks/benchmark_latency.py $LAT --quantization-config "$PTPC" \
  --output-json $L/call49_latency_base.json > $L/call49_latency_base.log 2>&1
echo "base rc $?" >> $L/rc.txt
cd $ROOT && export PYTHONPATH=/tmp/site:$ROOT
timeout 170 python -m pytest -q -m gpu -p no:cacheprovider tests/triton_utils/test_pdl.py tests/kernels/linear/test_gemv.py \
  tests/v1/worker/test_cuda_graphs.py > $L/call49_gpu_tests.log 2>&1
echo "tests rc $?" >> $L/rc.txt; pkill -f pytest
cd $OUT && tar czf logs.tgz logs && rm -rf logs
