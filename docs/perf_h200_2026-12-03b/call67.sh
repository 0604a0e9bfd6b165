#!/usr/bin/env bash
# Device call 67: the final MLA split rule (one-tile splits up to 33) where it differs from the
# previous one and was not yet timed (4106 tokens at batch 1-4, 2058 at batch 4); the MLA decode
# GPU tests; then benchmark_throughput.py on the final tree.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl .devrun/xd/*.whl
L=$OUT/logs; mkdir -p $L
export PYTHONPATH=/tmp/site:$PWD
for spec in "4106 1 2 4 -- 33 32" "2058 4 -- 33 16"; do
  ctx=${spec%% *}; rest=${spec#* }; batches=${rest%% --*}; splits=${rest#*-- }
  timeout 80 python benchmarks/kernels/benchmark_mla_decode.py --batches $batches --contexts $ctx --capacity $((ctx + 32)) \
    --block-size 16 --configs 16,64,8,5,c4 32,64,8,5,c4 --splits $splits --merge two > $L/call67_mla_$ctx.log 2>&1
  echo "mla $ctx rc $?"; grep -v -i warn $L/call67_mla_$ctx.log | grep -E "heuristic|x3[23]|x16" | head -12
done
timeout 170 python -m pytest -q -m gpu -p no:cacheprovider tests/models/kimi_k3/test_amd_mla_decode.py > $L/call67_gpu_tests.log 2>&1
echo "mla tests rc $?"; tail -2 $L/call67_gpu_tests.log
P='{"linear":"fp8_per_channel","ignore":["re:(?!.*self_attn\\.o_proj$).*"]}'
timeout 200 python benchmarks/benchmark_throughput.py --model kimi-linear-48b-a3b --load-format dummy --skip-tokenizer-init \
  --quantization-config "$P" --num-prompts 256 --input-len 1024 --output-len 128 --max-num-batched-tokens 8192 \
  --output-json $L/call67_throughput.json > $L/call67_throughput.log 2>&1
echo "throughput rc $?"; grep -v -i warn $L/call67_throughput.log | tail -12
