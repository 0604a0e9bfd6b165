#!/usr/bin/env bash
# Device call 57: the final tree's engine sweep at 1k (batch 1-256) and 8k (batch 1), with the
# old kernel files (d337546) at 64 and 256 (1k) and at 8k batch 1 in the same call.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl .devrun/xd/*.whl
export PYTHONUNBUFFERED=1
L=$OUT/logs; mkdir -p $L
rm -rf /tmp/base && mkdir /tmp/base && tar cf - --exclude=.git . | tar xf - -C /tmp/base && cp -r .devrun/base/vllm /tmp/base/
PTPC='{"linear":"fp8_per_channel","ignore":["re:(?!.*self_attn\\.o_proj$).*"]}'
COMMON="--model kimi-linear-48b-a3b --load-format dummy --skip-tokenizer-init --output-len 16 --warmup-steps 2 --profile-steps 2 --max-num-batched-tokens 8192"
run() {  # tree tag limit args...
  tree=$1; tag=$2; limit=$3; shift 3
  dir=$PWD; [ $tree = base ] && dir=/tmp/base
  (cd $dir && PYTHONPATH=/tmp/site:$dir timeout $limit python benchmarks/benchmark_latency.py $COMMON "$@" \
    --quantization-config "$PTPC" --output-json $L/call57_latency_$tag.json > $L/call57_latency_$tag.log 2>&1
   echo "lat $tag rc $?" >> $L/rc.txt)
}
run new new_1k 250 --batch-sizes 1 8 64 256 --input-lens 1024
run base base_1k 150 --batch-sizes 1 64 256 --input-lens 1024
run new new_8k 90 --batch-sizes 1 --input-lens 8192
run base base_8k 80 --batch-sizes 1 --input-lens 8192
cd $OUT && tar czf logs.tgz logs && rm -rf logs
