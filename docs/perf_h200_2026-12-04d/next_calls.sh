#!/usr/bin/env bash
# Prepared in the twenty-seventh run for the next device session (not run): where the batch
# phase's mixed steps go (call 110: ~0.32 s a step against 0.12 s for a prefill-only one), and
# the host time of eager prefill steps by function on this tree (call 41's probe). About 4 and 3
# minutes: one call each; then what a new prompt length costs in MLA's prefill attention (cuDNN's
# plan per shape?), about 1 minute. Carry [".whl", ".devrun"]; PART=sdpa|mixed|host.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl .devrun/xd/*.whl
export PYTHONPATH=/tmp/site:$PWD
P='{"linear":"fp8_per_channel","ignore":["re:(?!.*self_attn\\.o_proj$).*"]}'
case "${PART:-sdpa}" in
  sdpa)
    for mode in default avoid_recompile flash; do
      timeout 150 python docs/perf_h200_2026-12-04d/sdpa_lengths.py $mode > $OUT/sdpa_$mode.log 2>&1
      echo "sdpa $mode rc $?"; cat $OUT/sdpa_$mode.log
    done ;;
  mixed)
    PROFILED=4 timeout 420 python docs/perf_h200_2026-12-04d/mixed_steps.py --model kimi-linear-48b-a3b \
      --load-format dummy --skip-tokenizer-init --quantization-config "$P" --batch-sizes 16 \
      --input-lens 8192 --output-len 2 --warmup-steps 1 --max-num-batched-tokens 8192 \
      > $OUT/mixed.log 2>&1
    echo "mixed rc $?"; grep -v "^INFO\|USDT" $OUT/mixed.log | tail -80 ;;
  host)
    timeout 300 python docs/perf_h200_2026-12-02e/call41_host_probe.py > $OUT/host.log 2>&1
    echo "host rc $?"; tail -80 $OUT/host.log ;;
esac
