#!/usr/bin/env bash
# Device call 96: the engine's whole latency grid on main (the greedy argmax's kernels; batch 1, 8, 64,
# 256 x context 1k, 8k).
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
L=$OUT/logs; mkdir -p $L
export PYTHONPATH=/tmp/site:$PWD
P='{"linear":"fp8_per_channel","ignore":["re:(?!.*self_attn\\.o_proj$).*"]}'
timeout 570 python benchmarks/benchmark_latency.py --model kimi-linear-48b-a3b --load-format dummy \
  --skip-tokenizer-init --quantization-config "$P" --batch-sizes 1 8 64 256 --input-lens 1024 8192 \
  --output-len 16 --warmup-steps 2 --profile-steps 2 --max-num-batched-tokens 8192 \
  --time-budget-s 440 --output-json $L/call96_latency.json > $L/call96_latency.log 2>&1
echo "latency rc $?"; grep -E "copy_|matmul|warm-up|prefill \(|decode \(graph" $L/call96_latency.log
