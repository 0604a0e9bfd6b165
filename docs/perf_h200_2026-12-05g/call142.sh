#!/usr/bin/env bash
# Thirty-seventh run, call 142 (carry [".whl", ".devrun"]): start-up on a cold Triton cache with
# the mixed-step warm-up (efce2cb), the engine the grid's batch 256 sizes (35 decode graphs): load,
# warm-up, capture and engine ready, then the benchmark's first prefill (its kernel compilation).
# On an H100 (80 GB) the config with 128 of the 256 routed experts, as call140.sh.
set -u
M=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1)
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
MODEL=kimi-linear-48b-a3b
if [ "$M" -lt 100000 ]; then
  mkdir -p /tmp/k128 && python3 -c "
import json; c = json.load(open('vllm/models/kimi_k3/config_only/kimi-linear-48b-a3b/config.json'))
c['num_experts'] = 128; json.dump(c, open('/tmp/k128/config.json', 'w'))"
  MODEL=/tmp/k128
fi
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl .devrun/xd/*.whl
export PYTHONPATH=/tmp/site:$PWD
rm -rf ~/.triton/cache ${TRITON_CACHE_DIR:-/nonexistent}
P='{"linear":"fp8_per_channel","ignore":["re:(?!.*self_attn\\.o_proj$).*"]}'
S=$(date +%s.%N)
timeout ${LIMIT:-400} python benchmarks/benchmark_latency.py --model $MODEL \
  --load-format dummy --skip-tokenizer-init --quantization-config "$P" --batch-sizes 256 \
  --input-lens 1024 --output-len 2 --warmup-steps 1 --max-num-batched-tokens 8192 \
  --time-budget-s 1 > $OUT/cold_start.log 2>&1
echo "rc $? process $(python -c "print(round($(date +%s.%N) - $S, 1))") s"
grep -h "Loaded\|load\|Warmed\|Captured\|engine ready\|warm-up (kernel" $OUT/cold_start.log | cut -c1-200 | head -12
