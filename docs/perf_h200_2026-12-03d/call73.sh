#!/usr/bin/env bash
# Device call 73: the fused op's host time, main (490e218) against this session's tree, three
# alternating pairs pinned to one core, base first; the engine at batch 1, contexts 1k and 8k
# (decode step against the floor, the prefills with their profiles) on this session's tree.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
L=$OUT/logs; mkdir -p $L
export PYTHONPATH=/tmp/site:$PWD
rm -rf /tmp/base && mkdir /tmp/base && cp -r .devrun/base/vllm .devrun/base/benchmarks /tmp/base/
host() { # tree tag
  (cd $1 && PYTHONPATH=/tmp/site:$1 timeout 100 taskset -c 3 python \
    benchmarks/kernels/benchmark_rmsnorm_gated_fp8_per_token.py --host-overhead --no-fla \
    > /tmp/host_$2.log 2>&1); echo "host $2 rc $?"; grep "^#   fused" /tmp/host_$2.log
  cat /tmp/host_$2.log >> $L/call73_host.log
}
for i in 1 2 3; do host /tmp/base base$i; host $PWD new$i; done
timeout 60 taskset -c 3 python docs/perf_h200_2026-12-03d/launch_parts.py > $L/call73_launch_parts.log 2>&1
echo "parts rc $?"; head -6 $L/call73_launch_parts.log
P='{"linear":"fp8_per_channel","ignore":["re:(?!.*self_attn\\.o_proj$).*"]}'
timeout 380 python benchmarks/benchmark_latency.py --model kimi-linear-48b-a3b --load-format dummy \
  --skip-tokenizer-init --quantization-config "$P" --input-lens 1024 8192 --output-len 16 \
  --warmup-steps 2 --profile-steps 2 --profile-prefill --max-num-batched-tokens 8192 --batch-sizes 1 \
  --output-json $L/call73_latency.json > $L/call73_latency.log 2>&1
echo "latency rc $?"; grep -E "copy_|warm-up|prefill \(single|decode \(graph" $L/call73_latency.log
