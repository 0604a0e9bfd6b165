#!/usr/bin/env bash
# Prepared for the next device session (not run): the whole GPU suite and the engine's latency grid
# on this session's main (tail tiles, fla-core's gate), then where the host keeps an 8k prefill
# waiting, with the driver API's launches matched. About 8 + 5 + 2 minutes: run as three calls.
# Carry [".whl", ".devrun"]; PART=suite|grid|gaps.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl .devrun/xd/*.whl
export PYTHONPATH=/tmp/site:$PWD
P='{"linear":"fp8_per_channel","ignore":["re:(?!.*self_attn\\.o_proj$).*"]}'
case "${PART:-grid}" in
  suite)
    timeout 590 python -m pytest -q -m gpu -n 4 -p no:cacheprovider --durations=20 tests > $OUT/gpu_tests.log 2>&1
    echo "suite rc $?"; tail -3 $OUT/gpu_tests.log ;;
  grid)
    timeout 570 python benchmarks/benchmark_latency.py --model kimi-linear-48b-a3b --load-format dummy \
      --skip-tokenizer-init --quantization-config "$P" --batch-sizes 1 8 64 256 --input-lens 1024 8192 \
      --output-len 16 --warmup-steps 2 --profile-steps 2 --max-num-batched-tokens 8192 \
      --time-budget-s 440 --output-json $OUT/latency.json > $OUT/latency.log 2>&1
    echo "grid rc $?"; grep -E "copy_|matmul|prefill \(|decode \(graph" $OUT/latency.log ;;
  gaps)
    timeout 300 python docs/perf_h200_2026-12-04c/prefill_gaps.py --model kimi-linear-48b-a3b \
      --load-format dummy --skip-tokenizer-init --quantization-config "$P" --batch-sizes 1 \
      --input-lens 8192 --output-len 2 --warmup-steps 1 --profile-prefill \
      --max-num-batched-tokens 8192 > $OUT/gaps.log 2>&1
    echo "gaps rc $?"; grep -A120 "device gaps over" $OUT/gaps.log | head -120 ;;
esac
