#!/usr/bin/env bash
# Thirty-sixth run's device call (carry [".whl", ".devrun"]).
# H200 (> 100 GB): the issue's whole grid on this tree (PART=grid of
# docs/perf_h200_2026-12-04e/next_calls.sh). H100 (80 GB; the 48B model does not fit): the
# steady-state mixed steps' host profile (docs/perf_h200_2026-12-05b/host_profile.py) on
# Kimi-Linear-48B-A3B's config with 128 of its 256 routed experts (~25 B parameters). A step's
# host work (layers, launches, shapes) does not depend on the number of experts, only the
# routing's distribution over them does. PART=compiles: step_compiles.py, which kernels Triton
# compiles in which mixed step. PART=ab (ab_mixed.py): the batch phase of 64 prompts of 8k with the
# decode launches by class (this tree) and by exact count (before af2246d), one after the other.
set -u
M=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1)
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
if [ "$M" -gt 100000 ] && [ -z "${PART:-}" ]; then
  PART=grid bash docs/perf_h200_2026-12-04e/next_calls.sh
  exit
fi
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl .devrun/xd/*.whl
export PYTHONPATH=/tmp/site:$PWD
mkdir -p /tmp/k128
python - <<'PY'
import json
c = json.load(open("vllm/models/kimi_k3/config_only/kimi-linear-48b-a3b/config.json"))
c["num_experts"] = 128
json.dump(c, open("/tmp/k128/config.json", "w"), indent=1)
PY
P='{"linear":"fp8_per_channel","ignore":["re:(?!.*self_attn\\.o_proj$).*"]}'
if [ "${PART:-}" = compiles ]; then  # which kernels compile in which mixed steps (eager)
  timeout ${LIMIT:-400} python docs/perf_h200_2026-12-05e/step_compiles.py --model /tmp/k128 \
    --load-format dummy --skip-tokenizer-init --quantization-config "$P" --batch-sizes ${BATCH:-32} \
    --input-lens 8192 --output-len 64 --warmup-steps 1 --max-num-batched-tokens 8192 \
    --enforce-eager > $OUT/compiles.log 2>&1
  echo "compiles rc $?"; grep -v "^INFO\|USDT" $OUT/compiles.log | cut -c1-700 | tail -80
  exit
fi
if [ "${PART:-}" = ab ]; then  # the batch phase with launches by class, then by exact count
  for OLD in 0 1; do
    AB_OLD=$OLD timeout ${LIMIT:-270} python docs/perf_h200_2026-12-05e/ab_mixed.py --model /tmp/k128 \
      --load-format dummy --skip-tokenizer-init --quantization-config "$P" --batch-sizes ${BATCH:-64} \
      --input-lens 8192 --output-len 4 --warmup-steps 1 --max-num-batched-tokens 8192 \
      --time-budget-s 200 > $OUT/ab_$OLD.log 2>&1
    echo "AB_OLD=$OLD rc $?"; grep -v "^INFO\|USDT" $OUT/ab_$OLD.log | grep -A4 "^prefill"
  done
  exit
fi
WARM=${WARM:-4} TIMED=${TIMED:-4} PROFILED=${PROFILED:-2} timeout ${LIMIT:-480} python \
  docs/perf_h200_2026-12-05b/host_profile.py --model /tmp/k128 --load-format dummy \
  --skip-tokenizer-init --quantization-config "$P" --batch-sizes ${BATCH:-32} --input-lens 8192 \
  --output-len 64 --warmup-steps 1 --max-num-batched-tokens 8192 > $OUT/host.log 2>&1
echo "host rc $?"; grep -v "^INFO\|USDT" $OUT/host.log | head -150
