#!/usr/bin/env bash
# Thirty-ninth run, call 145 (carry [".whl", ".devrun"]; the tree with the KDA prefill graphs):
# prefill_graphs_ab.py, one prompt's prefill at $LENGTHS tokens (default 1k and 8k) with the KDA
# prefill core from CUDA graphs and eager, one process each, on the 48B config (H100: 128 of its
# 256 experts). Call 145 ran it with LIMIT=165; calls 146-147 ran the script by hand
# (docs/performance.md, thirty-ninth run).
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
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD
for G in 1 0; do
  VLLM_KDA_PREFILL_GRAPHS=$G timeout ${LIMIT:-260} python docs/perf_h200_2026-12-05h/prefill_graphs_ab.py \
    --model $MODEL --lengths ${LENGTHS:-1024 8192} --reps ${REPS:-5} > $OUT/ab_$G.log 2>&1
  echo "graphs=$G rc $?"; grep -h "VLLM_KDA\|Captured\|Error\|error" $OUT/ab_$G.log | cut -c1-200 | tail -12
done
