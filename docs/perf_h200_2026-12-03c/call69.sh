#!/usr/bin/env bash
# Device call 69: the final batched GEMV (x as a tile in the weight's layout, up to 2 rows) against
# torch.bmm on MLA's absorbs; the 2-D GEMV on o_proj at 1 and 2 rows (its row helper changed
# shape); the GPU tests of the GEMV and the MLA layer; the engine at batch 1 and 2 (1k) against
# the previous mla.py (base); one sequence's MLA decode at 16k and 32k with 33 and the rule's
# splits.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl .devrun/xd/*.whl
L=$OUT/logs; mkdir -p $L
export PYTHONPATH=/tmp/site:$PWD
rm -rf /tmp/base && mkdir /tmp/base && cp -r benchmarks vllm /tmp/base/ && cp -r .devrun/base/vllm /tmp/base/
(cd benchmarks/kernels && timeout 90 python benchmark_gemv_batched.py --m 1 2 4 \
  --configs default 32,128,4,1,1 8,512,4,1,1 16,512,8,1,1 > $L/call69_batched.log 2>&1)
echo "batched rc $?"; grep -E "copy|best GEMV|default|bmm" $L/call69_batched.log
(cd benchmarks/kernels && timeout 60 python benchmark_gemv.py --dtypes fp8 bf16 --shapes o_proj --m 1 2 > $L/call69_gemv.log 2>&1)
echo "gemv rc $?"; grep -E "M=  [12] " $L/call69_gemv.log
timeout 150 python -m pytest -q -m gpu -p no:cacheprovider tests/kernels/linear/test_gemv.py \
  tests/models/kimi_k3/test_amd_mla.py > $L/call69_gpu_tests.log 2>&1
echo "tests rc $?"; tail -3 $L/call69_gpu_tests.log
for ctx in 16394 32778; do
  timeout 60 python benchmarks/kernels/benchmark_mla_decode.py --batches 1 --contexts $ctx --capacity $((ctx + 32)) \
    --block-size 16 --configs 16,64,8,5,c4 --splits 33 --merge two --csv /tmp/mla_$ctx.csv > /tmp/mla_$ctx.log 2>&1
  echo "mla $ctx rc $?"; grep -E "heuristic" /tmp/mla_$ctx.log
done
P='{"linear":"fp8_per_channel","ignore":["re:(?!.*self_attn\\.o_proj$).*"]}'
lat() { # tree tag ctx batch-sizes
  (cd $1 && PYTHONPATH=/tmp/site:$1 timeout 200 python benchmarks/benchmark_latency.py --model kimi-linear-48b-a3b \
    --load-format dummy --skip-tokenizer-init --quantization-config "$P" --input-lens $3 --output-len 16 \
    --warmup-steps 2 --profile-steps 2 --max-num-batched-tokens 8192 --batch-sizes $4 \
    --output-json /tmp/call69_latency_$2_$3.json > $L/call69_latency_$2_$3.log 2>&1)
  echo "latency $2 $3 rc $?"; grep -E "_gemv_kernel|NNT|^ *[0-9]+ +[12] +graph|copy" $L/call69_latency_$2_$3.log
}
lat $PWD new 1024 "1 2"
lat /tmp/base base 1024 "1 2"
