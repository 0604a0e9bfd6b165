#!/usr/bin/env bash
# Thirty-seventh run, call 141: start-up and the first mixed steps with and without the mixed-step
# warm-up (efce2cb), one warm machine, the same command (step_compiles.py, batch 32 of 8k, graphs
# on). The old runner is model_runner.py of cbaf82c, copied over the device's copy of the tree
# (old_model_runner.py, an untracked file carried for this call only).
set -u
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl .devrun/xd/*.whl
export PYTHONPATH=/tmp/site:$PWD
P='{"linear":"fp8_per_channel","ignore":["re:(?!.*self_attn\\.o_proj$).*"]}'
cp vllm/v1/worker/model_runner.py /tmp/new_model_runner.py
for RUN in new old new old; do
  if [ $RUN = old ]; then cp old_model_runner.py vllm/v1/worker/model_runner.py;
  else cp /tmp/new_model_runner.py vllm/v1/worker/model_runner.py; fi
  S=$(date +%s.%N)
  WARM=1 STEPS=4 timeout 150 python docs/perf_h200_2026-12-05e/step_compiles.py \
    --model kimi-linear-48b-a3b --load-format dummy --skip-tokenizer-init --quantization-config "$P" \
    --batch-sizes 32 --input-lens 8192 --output-len 64 --warmup-steps 1 \
    --max-num-batched-tokens 8192 > $OUT/ab_$RUN.log 2>&1
  E=$(date +%s.%N)
  echo "== $RUN rc $? process $(python -c "print(round($E - $S, 1))") s"
  grep -h "engine ready\|warm-up (kernel\|^step \|Warmed\|Captured" $OUT/ab_$RUN.log | cut -c1-160
done
