#!/usr/bin/env bash
# Thirty-sixth run, call 136 (carry [".whl", ".devrun"]; fits an H100), on the tree with the
# launch-key fixes (f012c99..2de14b6: no specialization on counts and metadata alignment; the
# alignment in launch()'s key):
# 1. the GPU tests of the changed kernels and of launch();
# 2. call 133's compile probe again (expected: only the decode kernels' new classes; no conv);
# 3. while time is left: the batch phase by exact count (its variants compiled in the process, the
#    disk cache cold for them), then by class (warm from 2).
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl .devrun/xd/*.whl
export PYTHONPATH=/tmp/site:$PWD
timeout 170 python -m pytest -q -m gpu -n 4 -p no:cacheprovider tests/triton_utils/test_launch.py \
  tests/models/kimi_k3/test_amd_causal_conv1d.py tests/models/kimi_k3/test_amd_mla_prefill.py \
  tests/model_executor/layers/fused_moe/test_gather_rows.py tests/model_executor/test_fp8_ptpc_linear.py \
  > $OUT/tests.log 2>&1
echo "tests rc $?"; tail -4 $OUT/tests.log
PART=compiles LIMIT=230 bash docs/perf_h200_2026-12-05e/call.sh | grep -E "^(compiles rc|step|warm-up|NVIDIA)|_kernel:" | cut -c1-160
P='{"linear":"fp8_per_channel","ignore":["re:(?!.*self_attn\\.o_proj$).*"]}'
for OLD in 1 0; do
  [ $SECONDS -lt 400 ] || break
  AB_OLD=$OLD timeout 100 python docs/perf_h200_2026-12-05e/ab_mixed.py --model /tmp/k128 \
    --load-format dummy --skip-tokenizer-init --quantization-config "$P" --batch-sizes 64 \
    --input-lens 8192 --output-len 4 --warmup-steps 1 --max-num-batched-tokens 8192 \
    --time-budget-s 90 > $OUT/ab_$OLD.log 2>&1
  echo "AB_OLD=$OLD rc $?"; grep -E "warm-up|B=  64 prefill" $OUT/ab_$OLD.log
done
