#!/usr/bin/env bash
# Device call 74: this session's tree (2013743) in the engine beyond batch 1: throughput on a
# fresh machine, the decode at batch 64 and 256 (1k), then throughput again (a warm repeat).
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
L=$OUT/logs; mkdir -p $L
export PYTHONPATH=/tmp/site:$PWD
P='{"linear":"fp8_per_channel","ignore":["re:(?!.*self_attn\\.o_proj$).*"]}'
tp() { # tag
  timeout $2 python benchmarks/benchmark_throughput.py --model kimi-linear-48b-a3b --load-format dummy \
    --skip-tokenizer-init --quantization-config "$P" --num-prompts 256 --input-len 1024 --output-len 128 \
    --max-num-batched-tokens 8192 --output-json $L/call74_throughput_$1.json > $L/call74_throughput_$1.log 2>&1
  echo "throughput $1 rc $?"; grep -v -i warn $L/call74_throughput_$1.log | grep -v "^INFO" | tail -8
}
tp cold 200
timeout 200 python benchmarks/benchmark_latency.py --model kimi-linear-48b-a3b --load-format dummy \
  --skip-tokenizer-init --quantization-config "$P" --input-lens 1024 --output-len 16 \
  --warmup-steps 2 --profile-steps 2 --max-num-batched-tokens 8192 --batch-sizes 64 256 \
  --output-json $L/call74_latency.json > $L/call74_latency.log 2>&1
echo "latency rc $?"; grep -E "copy_|warm-up|decode \(graph" $L/call74_latency.log
tp warm 170
