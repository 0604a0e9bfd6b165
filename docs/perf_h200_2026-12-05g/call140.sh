#!/usr/bin/env bash
# Thirty-seventh run, call 140 (carry [".whl", ".devrun"]): the start-up warm-up of mixed steps
# (efce2cb) on the GPU: its GPU test, then which kernels compile in the first mixed steps with
# graphs on (step_compiles.py; the full 48B config on an H200, 128 experts on an H100).
set -u
M=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1)
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl .devrun/xd/*.whl
export PYTHONPATH=/tmp/site:$PWD
timeout 200 python -m pytest -q -m gpu -p no:cacheprovider tests/v1/worker/test_cuda_graphs.py \
  > $OUT/gpu_tests.log 2>&1
echo "gpu rc $?"; tail -5 $OUT/gpu_tests.log
MODEL=kimi-linear-48b-a3b
if [ "$M" -lt 100000 ]; then
  mkdir -p /tmp/k128 && python -c "
import json; c = json.load(open('vllm/models/kimi_k3/config_only/kimi-linear-48b-a3b/config.json'))
c['num_experts'] = 128; json.dump(c, open('/tmp/k128/config.json', 'w'))"
  MODEL=/tmp/k128
fi
P='{"linear":"fp8_per_channel","ignore":["re:(?!.*self_attn\\.o_proj$).*"]}'
WARM=1 STEPS=${STEPS:-10} timeout ${LIMIT:-330} python docs/perf_h200_2026-12-05e/step_compiles.py \
  --model $MODEL --load-format dummy --skip-tokenizer-init --quantization-config "$P" \
  --batch-sizes 32 --input-lens 8192 --output-len 64 --warmup-steps 1 \
  --max-num-batched-tokens 8192 > $OUT/compiles.log 2>&1
echo "compiles rc $?"; grep -v "^INFO\|USDT" $OUT/compiles.log | cut -c1-400 | tail -40
grep -h "Warmed up mixed\|Captured" $OUT/compiles.log | head -3
