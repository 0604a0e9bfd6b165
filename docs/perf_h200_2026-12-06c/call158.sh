#!/usr/bin/env bash
# Forty-second run, call 158 (carry [".whl"]): replay_probe.py in three processes one after
# another (the first on a fresh machine): whether the 1k prompt alone replays the KDA prefill
# graphs in each, and its time. On an H100 the 48B config with 128 of its 256 experts.
set -u
M=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1)
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
MODEL=kimi-linear-48b-a3b
if [ "$M" -lt 100000 ]; then
  mkdir -p /tmp/k128 && python3 -c "
import json; c = json.load(open('vllm/models/kimi_k3/config_only/kimi-linear-48b-a3b/config.json'))
c['num_experts'] = 128; json.dump(c, open('/tmp/k128/config.json', 'w'))"
  MODEL=/tmp/k128
fi
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD TQDM_DISABLE=1
P='{"linear":"fp8_per_channel","ignore":["re:(?!.*self_attn\\.o_proj$).*"]}'
probe() {  # name limit lengths...
  local name=$1 limit=$2; shift 2
  timeout $limit python docs/perf_h200_2026-12-06c/replay_probe.py --model $MODEL \
    --load-format dummy --skip-tokenizer-init --quantization-config "$P" --batch-sizes 1 \
    --input-lens "$@" --prefill-reps 5 --output-len 4 --warmup-steps 1 \
    --max-num-batched-tokens 8192 --time-budget-s 150 --output-json $OUT/$name.json \
    > $OUT/$name.log 2>&1
  echo "$name rc $?"
  grep -v "^INFO\|USDT" $OUT/$name.log | grep "^L=.*single\|engine ready" | cut -c1-200
  grep "^\[step" $OUT/$name.log | tail -14 | cut -c1-200
}
probe p1 ${L1:-300} 1024 8192
probe p2 ${L2:-130} 1024 8192
probe p3 ${L3:-130} 1024
