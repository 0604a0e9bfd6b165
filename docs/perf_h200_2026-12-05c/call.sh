#!/usr/bin/env bash
# Thirty-third run's one device call (carry [".whl", ".devrun"]), sized for the device time left
# after refused starts (~400 s). On an H200 (the 48B model fits): the KDA layer's GPU tests on the
# mixed-step change (9e26640, never run on a GPU), then host_profile.py's steady-state mixed steps
# of 256 prompts of 1k and 8k on this tree (no baseline: its reversed patches would need a
# second engine start). On an H100 (it does not fit): the whole GPU suite, which holds those tests.
# SHORT=1 (~330 s, for what is left after more refused starts): the 8k prompts alone on an H200,
# the model package's GPU tests alone on an H100.
set -u
S=${SHORT:-0}
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl .devrun/xd/*.whl
export PYTHONPATH=/tmp/site:$PWD
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
python -c "import torch, triton; print(torch.__version__, triton.__version__)"
P='{"linear":"fp8_per_channel","ignore":["re:(?!.*self_attn\\.o_proj$).*"]}'
M=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1)
if [ "$S" = 2 ]; then  # SHORT=2 (~160 s): the KDA layer's GPU tests alone, on either card
  timeout 170 python -m pytest -q -m gpu -p no:cacheprovider tests/models/kimi_k3/test_amd_kda.py \
    tests/models/kimi_k3/test_amd_kda_oproj_ptpc.py > $OUT/kda_tests.log 2>&1
  echo "kda tests rc $?"; tail -8 $OUT/kda_tests.log
elif [ "$M" -gt 100000 ]; then
  timeout 150 python -m pytest -q -m gpu -p no:cacheprovider tests/models/kimi_k3/test_amd_kda.py \
    tests/models/kimi_k3/test_amd_kda_oproj_ptpc.py > $OUT/kda_tests.log 2>&1
  echo "kda tests rc $?"; tail -5 $OUT/kda_tests.log
  LENS="1024 8192"; [ "$S" = 1 ] && LENS=8192
  WARM=6 TIMED=6 PROFILED=0 timeout $((250 - 60 * S)) python docs/perf_h200_2026-12-05b/host_profile.py \
    --model kimi-linear-48b-a3b --load-format dummy --skip-tokenizer-init --quantization-config "$P" \
    --batch-sizes 256 --input-lens $LENS --output-len 64 --warmup-steps 1 \
    --max-num-batched-tokens 8192 > $OUT/host.log 2>&1
  echo "host rc $?"; grep "a step\|step (\|profiler step\|idle\|prefill (single\|copy\|matmul" $OUT/host.log
else
  WHAT=tests; [ "$S" = 1 ] && WHAT=tests/models/kimi_k3
  timeout $((420 - 120 * S)) python -m pytest -q -m gpu -n 4 -p no:cacheprovider --durations=20 $WHAT \
    > $OUT/gpu_tests.log 2>&1
  echo "gpu rc $?"; tail -30 $OUT/gpu_tests.log
fi
