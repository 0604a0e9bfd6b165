#!/usr/bin/env bash
# Device call 70: the final tree (the batched GEMV at one row, call 68's kernel and configs): GPU
# tests of the GEMV and the MLA layer; the engine at batch 1 (1k) against the previous mla.py.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl .devrun/xd/*.whl
L=$OUT/logs; mkdir -p $L
export PYTHONPATH=/tmp/site:$PWD
rm -rf /tmp/base && mkdir /tmp/base && cp -r benchmarks vllm /tmp/base/ && cp -r .devrun/base/vllm /tmp/base/
timeout 120 python -m pytest -q -m gpu -p no:cacheprovider tests/kernels/linear/test_gemv.py \
  tests/models/kimi_k3/test_amd_mla.py > $L/call70_gpu_tests.log 2>&1
echo "tests rc $?"; tail -3 $L/call70_gpu_tests.log
P='{"linear":"fp8_per_channel","ignore":["re:(?!.*self_attn\\.o_proj$).*"]}'
lat() { # tree tag
  (cd $1 && PYTHONPATH=/tmp/site:$1 timeout 200 python benchmarks/benchmark_latency.py --model kimi-linear-48b-a3b \
    --load-format dummy --skip-tokenizer-init --quantization-config "$P" --input-lens 1024 --output-len 16 \
    --warmup-steps 2 --profile-steps 2 --max-num-batched-tokens 8192 --batch-sizes 1 \
    --output-json /tmp/call70_latency_$2.json > $L/call70_latency_$2_1024.log 2>&1)
  echo "latency $2 rc $?"; grep -E "_gemv_kernel|NNT|^ *[0-9]+ +1 +graph|copy|bf16 GEMM / GEMV +[0-9]" $L/call70_latency_$2_1024.log
}
lat $PWD new
lat /tmp/base base
