#!/usr/bin/env bash
# Forty-first run, call 155 (carry [".whl"]), on a fresh machine: compile_probe.py, which logs every
# Triton compile and autotune with the engine step it falls in and every step over 180 ms, over
# the grid (call148.sh's arguments) on an H200, or on an H100 (the 48B model does not
# fit: its config with 128 of the 256 experts) over the 1k context at batch 256 only: where the
# 256 x 1k batch phase's time goes on a fresh machine (347 ms a step in call 148, 123-141 ms in
# call 154's second process).
set -u
M=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1)
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
MODEL=kimi-linear-48b-a3b
ARGS="--batch-sizes 1 8 64 256 --input-lens 1024 8192 --time-budget-s 400"
if [ "$M" -lt 100000 ]; then
  mkdir -p /tmp/k128 && python3 -c "
import json; c = json.load(open('vllm/models/kimi_k3/config_only/kimi-linear-48b-a3b/config.json'))
c['num_experts'] = 128; json.dump(c, open('/tmp/k128/config.json', 'w'))"
  MODEL=/tmp/k128
  ARGS="--batch-sizes 256 --input-lens 1024 --time-budget-s 280"
fi
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD
P='{"linear":"fp8_per_channel","ignore":["re:(?!.*self_attn\\.o_proj$).*"]}'
TRITON_PRINT_AUTOTUNING=1 timeout ${LIMIT:-540} python docs/perf_h200_2026-12-06b/compile_probe.py \
  --model $MODEL --load-format dummy --skip-tokenizer-init --quantization-config "$P" $ARGS \
  --output-len 16 --warmup-steps 2 --max-num-batched-tokens 8192 --output-json $OUT/grid.json \
  > $OUT/grid.log 2>&1
echo "grid rc $?"
grep -v "^INFO\|USDT" $OUT/grid.log | grep "^\[step\|^L=\|warm-up\|engine ready\|JIT compiles" | cut -c1-240 | tail -90
grep -h "Warmed\|Captured\|engine ready\|Loaded" $OUT/grid.log | cut -c1-200
