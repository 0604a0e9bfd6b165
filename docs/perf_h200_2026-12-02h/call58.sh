#!/usr/bin/env bash
# Device call 58: the bf16 GEMV (one-step config) against cuBLAS on KDA's in_proj and MLA's q|kv_a
# at M = 1-2, and the engine at batch 1 with those linears sent to the GEMV (alt: the bf16 GEMV's
# weight limit 32M elements instead of 12M) against main.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl .devrun/xd/*.whl
export PYTHONUNBUFFERED=1
L=$OUT/logs; mkdir -p $L
rm -rf /tmp/alt && mkdir /tmp/alt && tar cf - --exclude=.git . | tar xf - -C /tmp/alt && cp -r .devrun/alt/vllm /tmp/alt/
PYTHONPATH=/tmp/site:$PWD timeout 80 python benchmarks/kernels/benchmark_gemv.py --dtypes bf16 --shapes qkv mla_q_kv_a \
  --m 1 2 --configs default 2,4096,4,1,1 4,4096,4,1,1 2,2048,4,1,1 > $L/call58_gemv.log 2>&1
echo "gemv rc $?" >> $L/rc.txt
PTPC='{"linear":"fp8_per_channel","ignore":["re:(?!.*self_attn\\.o_proj$).*"]}'
COMMON="--model kimi-linear-48b-a3b --load-format dummy --skip-tokenizer-init --output-len 16 --warmup-steps 2 --profile-steps 2 --max-num-batched-tokens 8192 --batch-sizes 1 --input-lens 1024"
run() {  # tree tag limit
  dir=$PWD; [ $1 = alt ] && dir=/tmp/alt
  (cd $dir && PYTHONPATH=/tmp/site:$dir timeout $3 python benchmarks/benchmark_latency.py $COMMON \
    --quantization-config "$PTPC" --output-json $L/call58_latency_$2.json > $L/call58_latency_$2.log 2>&1
   echo "lat $2 rc $?" >> $L/rc.txt)
}
run alt alt1 170
run new new1 100
run alt alt2 100
cd $OUT && tar czf logs.tgz logs && rm -rf logs
