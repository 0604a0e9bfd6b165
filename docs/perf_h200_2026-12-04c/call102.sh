#!/usr/bin/env bash
# Device call 102: the grouped experts' GPU tests with the tail tiles on by default; the 8k prefill
# with the default 32-row tail tiles and where the host keeps the device waiting; then 0 and 64.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl .devrun/xd/*.whl
export PYTHONPATH=/tmp/site:$PWD
D=docs/perf_h200_2026-12-04c
timeout 130 python -m pytest -q -m gpu -n 4 -p no:cacheprovider tests/model_executor/test_fused_moe.py > $OUT/c102_tests.log 2>&1
echo "tests rc $?"; tail -3 $OUT/c102_tests.log
P='{"linear":"fp8_per_channel","ignore":["re:(?!.*self_attn\\.o_proj$).*"]}'
A=(--model kimi-linear-48b-a3b --load-format dummy --skip-tokenizer-init --quantization-config "$P" --batch-sizes 1
   --input-lens 8192 --output-len 2 --warmup-steps 1 --profile-prefill --max-num-batched-tokens 8192)
timeout 170 python $D/prefill_gaps.py "${A[@]}" --output-json $OUT/c102_prefill_32.json > $OUT/c102_prefill_32.log 2>&1
echo "engine gaps rc $?"; grep -E "single prompt|routed experts  |device busy|gate_up_kernel|down_kernel" $OUT/c102_prefill_32.log | head -8
for T in 0 64; do
  timeout 110 python $D/prefill_tail.py $T $OUT/c102_hist_$T.json "${A[@]}" --output-json $OUT/c102_prefill_$T.json > $OUT/c102_prefill_$T.log 2>&1
  echo "engine tail $T rc $?"; grep -E "single prompt|routed experts  |device busy|gate_up_kernel|down_kernel" $OUT/c102_prefill_$T.log | head -8
done
grep -A200 "device gaps over" $OUT/c102_prefill_32.log | head -120
