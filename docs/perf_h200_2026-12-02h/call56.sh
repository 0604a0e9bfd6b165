#!/usr/bin/env bash
# Device call 56: engine A/B at batch 1 and 8 (this tree against the old kernel files), the
# router benchmark A/B, GPU tests of the router and the GEMV.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl .devrun/xd/*.whl
export PYTHONUNBUFFERED=1
L=$OUT/logs; mkdir -p $L
rm -rf /tmp/base && mkdir /tmp/base && tar cf - --exclude=.git . | tar xf - -C /tmp/base && cp -r .devrun/base/vllm /tmp/base/
PTPC='{"linear":"fp8_per_channel","ignore":["re:(?!.*self_attn\\.o_proj$).*"]}'
LAT="--model kimi-linear-48b-a3b --load-format dummy --skip-tokenizer-init --batch-sizes 1 8 --input-lens 1024 --output-len 16 --warmup-steps 2 --profile-steps 2 --max-num-batched-tokens 8192"
run() {  # tree tag limit
  dir=$PWD; [ $1 = base ] && dir=/tmp/base
  (cd $dir && PYTHONPATH=/tmp/site:$dir timeout $3 python benchmarks/benchmark_latency.py $LAT --quantization-config "$PTPC" \
    --output-json $L/call56_latency_$2.json > $L/call56_latency_$2.log 2>&1; echo "lat $2 rc $?" >> $L/rc.txt)
}
run new new1 230
run base base1 170
run new new2 150
for tree in new base; do
  dir=$PWD; [ $tree = base ] && dir=/tmp/base
  (cd $dir && PYTHONPATH=/tmp/site:$dir timeout 60 python benchmarks/kernels/benchmark_router.py --fused-norm --tokens 1 \
    >> $L/call56_router_$tree.log 2>&1; echo "router $tree rc $?" >> $L/rc.txt)
done
export PYTHONPATH=/tmp/site:$PWD
timeout 100 python -m pytest -q -m gpu -p no:cacheprovider tests/model_executor/layers/fused_moe/test_fused_router.py \
  tests/kernels/linear/test_gemv.py > $L/call56_gpu_tests.log 2>&1
echo "tests rc $?" >> $L/rc.txt; pkill -f pytest
cd $OUT && tar czf logs.tgz logs && rm -rf logs
