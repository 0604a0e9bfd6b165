#!/usr/bin/env bash
# Forty-third run, call 163 (carry [".whl", ".devrun"]): the MoE prefill graphs (119962f) on a GPU.
# 1. Their GPU tests (replays against the eager block bit for bit; the engine's greedy tokens with
#    and without them), the KDA prefill graphs' and the decode graphs' tests beside them (the
#    decode capture runs the MoE blocks while the MoE graphs exist).
# 2. The 1k prompt under the profiler (call159.sh's q1), with the MoE graphs (g1) and without
#    (g0: VLLM_MOE_PREFILL_GRAPHS=0), one process each, alternating twice. On an H100 the 48B
#    config with 128 of its experts.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl .devrun/xd/*.whl
export PYTHONPATH=/tmp/site:$PWD
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
timeout 240 python -m pytest -q -m gpu -n 3 -p no:cacheprovider \
  tests/models/kimi_k3/test_amd_moe_prefill_graphs.py tests/v1/worker/test_cuda_graphs.py \
  > $OUT/gpu_tests.log 2>&1
echo "tests rc $?"; tail -3 $OUT/gpu_tests.log
M=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1)
MODEL=kimi-linear-48b-a3b
if [ "$M" -lt 100000 ]; then
  mkdir -p /tmp/k128 && python3 -c "
import json; c = json.load(open('vllm/models/kimi_k3/config_only/kimi-linear-48b-a3b/config.json'))
c['num_experts'] = 128; json.dump(c, open('/tmp/k128/config.json', 'w'))"
  MODEL=/tmp/k128
fi
export TQDM_DISABLE=1
P='{"linear":"fp8_per_channel","ignore":["re:(?!.*self_attn\\.o_proj$).*"]}'
for run in g1 g0 g1b g0b; do
  case $run in g0*) export VLLM_MOE_PREFILL_GRAPHS=0 ;; *) export VLLM_MOE_PREFILL_GRAPHS=1 ;; esac
  timeout ${LIMIT:-90} python benchmarks/benchmark_latency.py --model $MODEL --load-format dummy \
    --skip-tokenizer-init --quantization-config "$P" --batch-sizes 1 --input-lens 1024 \
    --prefill-reps 5 --profile-prefill --output-len 2 --warmup-steps 1 \
    --max-num-batched-tokens 8192 --time-budget-s 600 --output-json $OUT/$run.json > $OUT/$run.log 2>&1
  echo "$run rc $?"
  grep -h "Captured\|engine ready" $OUT/$run.log | cut -c1-160
  grep -h "single prompt\|device busy\|device idle" $OUT/$run.log | cut -c1-200
done
grep -A8 "longer gaps by the kernels" $OUT/g1.log | cut -c1-200
