#!/usr/bin/env bash
# Prepared in the fortieth run for the next device session (not run): why the batch phase of 256
# prompts of 1k takes ~347 ms a step (33 steps in 11.46 s, call 148) where the 8k phase's steps
# take ~154 ms (261 in 40.20 s) at the same 8192-token budget and up to 256 decode rows.
# host_profile.py (thirty-first run) on the H200's 48B model: WARM untimed steps, TIMED steps back
# to back and one by one with each step's schedule (host time in step() against the device's
# end), one step under torch.profiler (device busy against wall, idle gaps), then cProfile of
# PROFILED steps. Then sync_points.py (twenty-ninth run) on the phase's first STEPS steps: every
# call that makes the host wait for the device, by call site and count (step 0 prefills 8 prompts
# alone, the later ones are mixed). Carry [".whl", ".devrun"]; ~7 min on a warm machine.
set -u
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD
P='{"linear":"fp8_per_channel","ignore":["re:(?!.*self_attn\\.o_proj$).*"]}'
WARM=${WARM:-6} TIMED=${TIMED:-4} PROFILED=${PROFILED:-2} timeout ${LIMIT:-420} python \
  docs/perf_h200_2026-12-05b/host_profile.py --model kimi-linear-48b-a3b --load-format dummy \
  --skip-tokenizer-init --quantization-config "$P" --batch-sizes 256 --input-lens 1024 \
  --output-len 16 --warmup-steps 1 --max-num-batched-tokens 8192 > $OUT/host_1k.log 2>&1
echo "host rc $?"; grep -v "^INFO\|USDT" $OUT/host_1k.log | head -160
STEPS=${STEPS:-5} timeout ${SLIMIT:-300} python docs/perf_h200_2026-12-04e/sync_points.py \
  --model kimi-linear-48b-a3b --load-format dummy --skip-tokenizer-init --quantization-config "$P" \
  --batch-sizes 256 --input-lens 1024 --output-len 16 --warmup-steps 1 \
  --max-num-batched-tokens 8192 > $OUT/sync_1k.log 2>&1
echo "sync rc $?"; grep -v "^INFO\|USDT" $OUT/sync_1k.log | tail -60
