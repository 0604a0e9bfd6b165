#!/usr/bin/env bash
# Device call 66: the MoE gate/up at one token with the next step's loads issued before the
# previous step's sums, and the down kernel's next slot before the previous slot's (lookahead); MLA decode split counts (the fewest tiles a split that a wave
# allows) against the previous rule (kernel benchmark at batch 1, 2, 4 and 1k-8k contexts,
# capacity = context + 32 as the engine's); the engine at batch 1: this tree (both), the previous
# kernels (base: the MLA config and experts file of 894a92e) and the MLA change alone (nola), at 1k,
# and this tree against base at 8k; the GPU tests of both files.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl .devrun/xd/*.whl
L=$OUT/logs; mkdir -p $L
export PYTHONPATH=/tmp/site:$PWD
for t in base nola; do rm -rf /tmp/$t && mkdir /tmp/$t && cp -r benchmarks vllm /tmp/$t/ && cp -r .devrun/$t/vllm /tmp/$t/; done
timeout 120 python benchmarks/kernels/benchmark_moe.py --paths triton --tokens 1 --fused-shared-experts 1 \
  --triton-configs 8,256,4u/1,1024,1 8,256,4ul/1,1024,1 4,256,4ul/1,1024,1 16,256,8ul/1,1024,1 8,128,4ul/1,1024,1 \
  8,256,4u/1,1024,1l 8,256,4ul/1,1024,1l 4,256,4ul/1,1024,1l 8,256,4ul/2,1024,1l > $L/call66_moe.log 2>&1
echo "moe rc $?"; grep -v -i warn $L/call66_moe.log | tail -14
# old split counts (1, 2 / 4): 1034: 16 / 16; 2058: 16 / 16; 4106: 32 / 32; 8202: 64 / 33
for spec in "1034 16" "2058 16 32" "4106 32" "8202 64 33"; do
  set -- $spec; ctx=$1; shift
  timeout 100 python benchmarks/kernels/benchmark_mla_decode.py --batches 1 2 4 --contexts $ctx --capacity $((ctx + 32)) \
    --block-size 16 --configs 16,64,8,5,c4 32,64,8,5,c4 --splits "$@" --merge two > $L/call66_mla_$ctx.log 2>&1
  echo "mla $ctx rc $?"; grep -E "heuristic" $L/call66_mla_$ctx.log
done
P='{"linear":"fp8_per_channel","ignore":["re:(?!.*self_attn\\.o_proj$).*"]}'
lat() { # tree tag ctx
  (cd $1 && PYTHONPATH=/tmp/site:$1 timeout 170 python benchmarks/benchmark_latency.py --model kimi-linear-48b-a3b \
    --load-format dummy --skip-tokenizer-init --quantization-config "$P" --input-lens $3 --output-len 16 \
    --warmup-steps 2 --profile-steps 2 --max-num-batched-tokens 8192 --batch-sizes 1 \
    --output-json $L/call66_latency_$2_$3.json > $L/call66_latency_$2_$3.log 2>&1)
  echo "latency $2 $3 rc $?"; grep -E "_mla_decode|_moe_gate_up|^ *[0-9]+ +1 +graph" $L/call66_latency_$2_$3.log
}
lat $PWD new 1024
lat /tmp/base base 1024
lat /tmp/nola nola 1024
timeout 60 python -m pytest -q -m gpu -p no:cacheprovider tests/model_executor/test_fused_moe.py \
  -k "triton_kimi_linear_shapes" > $L/call66_gpu_tests.log 2>&1
echo "moe tests rc $?"; tail -2 $L/call66_gpu_tests.log
timeout 90 python -m pytest -q -m gpu -p no:cacheprovider tests/models/kimi_k3/test_amd_mla_decode.py >> $L/call66_gpu_tests.log 2>&1
echo "mla tests rc $?"; tail -2 $L/call66_gpu_tests.log
lat $PWD new 8192
lat /tmp/base base 8192
