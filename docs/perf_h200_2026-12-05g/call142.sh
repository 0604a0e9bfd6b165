#!/usr/bin/env bash
# Thirty-seventh run, call 142 (carry [".whl", ".devrun"]): start-up on a cold Triton cache with
# the mixed-step warm-up (efce2cb), the engine the grid's batch 256 sizes (35 decode graphs): load,
# warm-up, capture and engine ready, then the benchmark's first prefill (its kernel compilation).
set -u
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl .devrun/xd/*.whl
export PYTHONPATH=/tmp/site:$PWD
rm -rf ~/.triton/cache ${TRITON_CACHE_DIR:-/nonexistent}
P='{"linear":"fp8_per_channel","ignore":["re:(?!.*self_attn\\.o_proj$).*"]}'
S=$(date +%s.%N)
timeout ${LIMIT:-400} python benchmarks/benchmark_latency.py --model kimi-linear-48b-a3b \
  --load-format dummy --skip-tokenizer-init --quantization-config "$P" --batch-sizes 256 \
  --input-lens 1024 --output-len 2 --warmup-steps 1 --max-num-batched-tokens 8192 \
  --time-budget-s 1 > $OUT/cold_start.log 2>&1
echo "rc $? process $(python -c "print(round($(date +%s.%N) - $S, 1))") s"
grep -h "Loaded\|load\|Warmed\|Captured\|engine ready\|warm-up (kernel" $OUT/cold_start.log | cut -c1-200 | head -12
