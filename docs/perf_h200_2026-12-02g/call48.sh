#!/usr/bin/env bash
# Device call 48: programmatic dependent launch. Engine decode A/B (PDL on, then off, same
# machine), then the GPU test of PDL's bits.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl .devrun/xd/*.whl
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site:$PWD
L=$OUT/logs; mkdir -p $L
PTPC='{"linear":"fp8_per_channel","ignore":["re:(?!.*self_attn\\.o_proj$).*"]}'
LAT="--model kimi-linear-48b-a3b --load-format dummy --skip-tokenizer-init --batch-sizes 1 8 64 256 --input-lens 1024 --output-len 16 --warmup-steps 2 --profile-steps 2 --max-num-batched-tokens 8192"
VLLM_TRITON_PDL=1 timeout 240 python benchmarks/benchmark_latency.py $LAT --quantization-config "$PTPC" \
  --output-json $L/call48_latency_pdl.json > $L/call48_latency_pdl.log 2>&1
echo "pdl rc $?" >> $L/rc.txt
VLLM_TRITON_PDL=0 timeout 170 python benchmarks/benchmark_latency.py $LAT --quantization-config "$PTPC" \
  --output-json $L/call48_latency_nopdl.json > $L/call48_latency_nopdl.log 2>&1
echo "nopdl rc $?" >> $L/rc.txt
timeout 130 python -m pytest -q -m gpu -p no:cacheprovider tests/triton_utils/test_pdl.py > $L/call48_gpu_tests.log 2>&1
echo "tests rc $?" >> $L/rc.txt; pkill -f pytest
cd $OUT && tar czf logs.tgz logs && rm -rf logs
