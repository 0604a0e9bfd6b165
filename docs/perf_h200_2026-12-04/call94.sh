#!/usr/bin/env bash
# Call 94: the Triton greedy argmax (vllm/v1/sample/ops/argmax.py) on the H200.
# 1. Its GPU tests and the sampler's; 2. its kernel benchmark; 3. the engine at batch 1 and 64,
#    1k and 8k, on this tree and on .devrun/base (8548218: torch's argmax), one machine.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl .devrun/xd/*.whl
export PYTHONPATH=/tmp/site:$PWD
L=$OUT/logs; mkdir -p $L
NEW=$PWD; BASE=$PWD/.devrun/base
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader > $L/env.txt
python -c "import torch, triton; print(torch.__version__, triton.__version__)" >> $L/env.txt
timeout 120 python -m pytest -q -m gpu tests/v1/sample tests/benchmarks/test_kernel_benchmarks_dry_run.py \
  > $L/call94_gpu_tests.log 2>&1; echo "gpu tests rc $?"; tail -3 $L/call94_gpu_tests.log
(cd benchmarks/kernels && timeout 120 python benchmark_argmax.py --rows 1 8 64 256 --dtypes bfloat16 float32 \
  --csv $L/call94_argmax.csv > $L/call94_argmax.log 2>&1; echo "argmax bench rc $?"; grep -E "copy|torch .* best" $L/call94_argmax.log)
P='{"linear":"fp8_per_channel","ignore":["re:(?!.*self_attn\\.o_proj$).*"]}'
engine() { # tree tag limit
  (cd $1 && PYTHONPATH=/tmp/site:$1 timeout $3 python benchmarks/benchmark_latency.py --model kimi-linear-48b-a3b \
    --load-format dummy --skip-tokenizer-init --quantization-config "$P" --batch-sizes 1 64 \
    --input-lens 1024 8192 --output-len 16 --warmup-steps 2 --profile-steps 2 \
    --max-num-batched-tokens 8192 --output-json $L/call94_latency_$2.json > $L/call94_latency_$2.log 2>&1)
  echo "latency $2 rc $?"; grep -E "warm-up|decode \(graph" $L/call94_latency_$2.log
  grep -iE "argmax" $L/call94_latency_$2.log | head -12
}
engine $NEW new 250
engine $BASE base 170
