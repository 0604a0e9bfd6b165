#!/usr/bin/env bash
# Device call 51: final main. 8k prompt: prefill (single prompt) and batch-1 decode at 8k
# context, PDL on then off on the same machine.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl .devrun/xd/*.whl
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site:$PWD
L=$OUT/logs; mkdir -p $L
PTPC='{"linear":"fp8_per_channel","ignore":["re:(?!.*self_attn\\.o_proj$).*"]}'
LAT="--model kimi-linear-48b-a3b --load-format dummy --skip-tokenizer-init --batch-sizes 1 --input-lens 8192 --output-len 16 --warmup-steps 2 --profile-steps 2 --profile-prefill --max-num-batched-tokens 8192"
VLLM_TRITON_PDL=1 timeout 230 python benchmarks/benchmark_latency.py $LAT --quantization-config "$PTPC" \
  --output-json $L/call51_latency_pdl.json > $L/call51_latency_pdl.log 2>&1
echo "pdl rc $?" >> $L/rc.txt
VLLM_TRITON_PDL=0 timeout 150 python benchmarks/benchmark_latency.py $LAT --quantization-config "$PTPC" \
  --output-json $L/call51_latency_nopdl.json > $L/call51_latency_nopdl.log 2>&1
echo "nopdl rc $?" >> $L/rc.txt
cd $OUT && tar czf logs.tgz logs && rm -rf logs
