#!/usr/bin/env bash
# Call 117: MLA prefill by shape (flash for new prompts up to 2048 tokens, cuDNN's
# per-length-class plans above): its GPU tests, then the engine's prefill and batch phase with
# the per-length-class plans on (the default) and off. Carry [".whl", ".devrun"].
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl .devrun/xd/*.whl
export PYTHONPATH=/tmp/site:$PWD
timeout 150 python -m pytest -q -m gpu -n 4 -p no:cacheprovider --durations=4 \
  tests/models/kimi_k3/test_amd_mla_prefill.py tests/models/kimi_k3/test_amd_mla.py > $OUT/gpu_tests.log 2>&1
echo "tests rc $?"; grep -v "Warning\|warner" $OUT/gpu_tests.log | tail -8
P='{"linear":"fp8_per_channel","ignore":["re:(?!.*self_attn\\.o_proj$).*"]}'
for v in 1 0; do
  TORCH_CUDNN_SDPA_AVOID_RECOMPILE=$v timeout 220 python benchmarks/benchmark_latency.py \
    --model kimi-linear-48b-a3b --load-format dummy --skip-tokenizer-init --quantization-config "$P" \
    --batch-sizes 64 --input-lens 1024 8192 --output-len 4 --warmup-steps 1 \
    --max-num-batched-tokens 8192 --time-budget-s 400 --output-json $OUT/latency_$v.json > $OUT/latency_$v.log 2>&1
  echo "latency avoid_recompile=$v rc $?"; grep -v "^INFO\|USDT" $OUT/latency_$v.log | grep -A6 "^prefill"
done
