#!/usr/bin/env bash
# Device call 74: this session's tree with the eager launch sites of the prefill (top-k, row
# grouping, weighted sum, KDA gate, conv1d, MLA key) through launch(): their host time with the
# fast path on and off in one process; their GPU tests; the engine beyond batch 1 (decode at
# batch 64 and 256, 1k) and throughput (on the Triton cache the latency run warmed).
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
L=$OUT/logs; mkdir -p $L
export PYTHONPATH=/tmp/site:$PWD
timeout 90 python docs/perf_h200_2026-12-03d/launch_sites.py > $L/call74_launch_sites.log 2>&1
echo "sites rc $?"; cat $L/call74_launch_sites.log | grep -v -i warn
timeout 130 python -m pytest -q -m gpu -p no:cacheprovider tests/triton_utils/test_launch.py \
  tests/model_executor/layers/fused_moe/ tests/models/kimi_k3/test_amd_kda_gate.py \
  tests/models/kimi_k3/test_amd_causal_conv1d.py tests/models/kimi_k3/test_amd_mla_prefill.py \
  > $L/call74_gpu_tests.log 2>&1
echo "tests rc $?"; tail -3 $L/call74_gpu_tests.log
P='{"linear":"fp8_per_channel","ignore":["re:(?!.*self_attn\\.o_proj$).*"]}'
timeout 190 python benchmarks/benchmark_latency.py --model kimi-linear-48b-a3b --load-format dummy \
  --skip-tokenizer-init --quantization-config "$P" --input-lens 1024 --output-len 16 \
  --warmup-steps 2 --max-num-batched-tokens 8192 --batch-sizes 64 256 \
  --output-json $L/call74_latency.json > $L/call74_latency.log 2>&1
echo "latency rc $?"; grep -E "copy_|warm-up|prefill \(|decode \(graph" $L/call74_latency.log
timeout 160 python benchmarks/benchmark_throughput.py --model kimi-linear-48b-a3b --load-format dummy \
  --skip-tokenizer-init --quantization-config "$P" --num-prompts 256 --input-len 1024 --output-len 128 \
  --max-num-batched-tokens 8192 --output-json $L/call74_throughput.json > $L/call74_throughput.log 2>&1
echo "throughput rc $?"; grep -v -i warn $L/call74_throughput.log | grep -v "^INFO" | tail -8
