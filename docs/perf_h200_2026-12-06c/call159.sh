#!/usr/bin/env bash
# Forty-second run, call 159 (carry [".whl"]): the 1k prompt alone under the profiler in two
# processes (`--profile-prefill`: device busy against wall, kernel groups): whether a slow
# process's 1k prompt (call 158: 0.055 s against 0.044 s, every KDA layer replaying its graph in
# both) waits on the host or on the device. On an H100 the 48B config with 128 of its experts.
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
for run in "q1 ${L1:-250}" "q2 ${L2:-110}"; do
  set -- $run
  timeout $2 python benchmarks/benchmark_latency.py --model $MODEL --load-format dummy \
    --skip-tokenizer-init --quantization-config "$P" --batch-sizes 1 --input-lens 1024 \
    --prefill-reps 3 --profile-prefill --output-len 2 --warmup-steps 1 \
    --max-num-batched-tokens 8192 --time-budget-s 600 --output-json $OUT/$1.json > $OUT/$1.log 2>&1
  echo "$1 rc $?"
  grep -v "^INFO\|USDT" $OUT/$1.log | grep -A12 "^L=.*single\|device time of one prefill" | cut -c1-160 | head -30
done
