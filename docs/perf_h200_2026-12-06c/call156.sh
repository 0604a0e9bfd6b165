#!/usr/bin/env bash
# Forty-second run, call 156 (carry [".whl", ".devrun"]): next_calls.sh of the forty-first run on
# whichever card comes. On an H100 the 48B model does not fit: its config with 128 of the 256
# experts, batch 256 at 1k and 8k only (call 155's pattern). Runs the MoE GPU tests (0f63d96),
# the grid with the warm-up bands (c6a509b; the 1k phase's steps ~130 ms on an H200 in call 154),
# and profile_check.py (167402c's budget, c55301a's "Warmed up N prefill step sizes" line).
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
  ARGS="--batch-sizes 1 256 --input-lens 1024 8192 --time-budget-s 300"
fi
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl .devrun/xd/*.whl
export PYTHONPATH=/tmp/site:$PWD
timeout ${TLIMIT:-150} python -m pytest -q -m gpu -n 4 -p no:cacheprovider \
  tests/model_executor/test_fused_moe.py > $OUT/moe_tests.log 2>&1
echo "tests rc $?"; tail -3 $OUT/moe_tests.log
P='{"linear":"fp8_per_channel","ignore":["re:(?!.*self_attn\\.o_proj$).*"]}'
timeout ${LIMIT:-330} python docs/perf_h200_2026-12-06b/compile_probe.py \
  --model $MODEL --load-format dummy --skip-tokenizer-init --quantization-config "$P" $ARGS \
  --output-len 16 --warmup-steps 2 --max-num-batched-tokens 8192 --output-json $OUT/grid.json \
  > $OUT/grid.log 2>&1
echo "grid rc $?"
grep -v "^INFO\|USDT" $OUT/grid.log | grep "^\[step\|^L=\|warm-up\|engine ready\|JIT compiles" | cut -c1-240 | tail -70
grep -h "Warmed\|Captured\|engine ready\|Loaded" $OUT/grid.log | cut -c1-200
VLLM_KDA_PREFILL_GRAPHS=1 timeout 90 python docs/perf_h200_2026-12-06/profile_check.py \
  > $OUT/profile_1.log 2>&1
echo "profile rc $?"; grep -h "Captured\|Warmed\|Memory:\|KV cache:\|Error\|tokens " $OUT/profile_1.log | cut -c1-220
