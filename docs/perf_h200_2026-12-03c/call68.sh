#!/usr/bin/env bash
# Device call 68: MLA's absorbed W_UK / W_UV products as one batched-GEMV launch each (up to 8
# rows) against torch.bmm: kernel benchmark with a config sweep, the GPU tests of the GEMV and
# the MLA layer, the engine at batch 1 and 8 (1k) against the previous mla.py (base); the MLA
# decode at one 8k sequence with 33 and 64 splits; the router's top-8 selection by rank counting
# (the fused router with it: kernel benchmark and engine at batch 1, rank).
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl .devrun/xd/*.whl
L=$OUT/logs; mkdir -p $L
export PYTHONPATH=/tmp/site:$PWD
for t in base rank; do rm -rf /tmp/$t && mkdir /tmp/$t && cp -r benchmarks vllm /tmp/$t/ && cp -r .devrun/$t/vllm /tmp/$t/; done
for t in $PWD /tmp/rank; do
  (cd $t && PYTHONPATH=/tmp/site:$t timeout 60 python benchmarks/kernels/benchmark_router.py --fused-norm --tokens 1 8 > $L/call68_router_$(basename $t).log 2>&1)
  echo "router $t rc $?"; grep -E "us" $L/call68_router_$(basename $t).log | grep -v -i warn | tail -6
done
(cd benchmarks/kernels && timeout 150 python benchmark_gemv_batched.py --m 1 2 4 8 16 64 \
  --configs default 64,128,4,1,1 32,128,4,1,1 16,128,4,1,1 16,512,4,1,1 8,512,4,1,1 4,512,4,1,1 \
  32,128,8,1,1 16,512,8,1,1 32,128,2,1,1 8,512,2,1,1 --output-json /tmp/call68_batched.json > $L/call68_batched.log 2>&1)
echo "batched rc $?"; grep -E "copy|best GEMV" $L/call68_batched.log
timeout 100 python -m pytest -q -m gpu -p no:cacheprovider tests/kernels/linear/test_gemv.py -k "batched or graph" \
  tests/models/kimi_k3/test_amd_mla.py > $L/call68_gpu_tests.log 2>&1
echo "tests rc $?"; tail -3 $L/call68_gpu_tests.log
timeout 60 python benchmarks/kernels/benchmark_mla_decode.py --batches 1 --contexts 8202 --capacity 8234 \
  --block-size 16 --configs 16,64,8,5,c4 --splits 33 64 --merge two --csv /tmp/call68_mla.csv > $L/call68_mla.log 2>&1
echo "mla rc $?"; grep -E "heuristic" $L/call68_mla.log; grep -E "x33|x64|splits|,33,|,64," /tmp/call68_mla.csv | head -8
P='{"linear":"fp8_per_channel","ignore":["re:(?!.*self_attn\\.o_proj$).*"]}'
lat() { # tree tag ctx batch-sizes
  (cd $1 && PYTHONPATH=/tmp/site:$1 timeout 200 python benchmarks/benchmark_latency.py --model kimi-linear-48b-a3b \
    --load-format dummy --skip-tokenizer-init --quantization-config "$P" --input-lens $3 --output-len 16 \
    --warmup-steps 2 --profile-steps 2 --max-num-batched-tokens 8192 --batch-sizes $4 \
    --output-json /tmp/call68_latency_$2_$3.json > $L/call68_latency_$2_$3.log 2>&1)
  echo "latency $2 $3 rc $?"; grep -E "_gemv_kernel|NNT|_mla_decode|^ *[0-9]+ +[18] +graph|copy" $L/call68_latency_$2_$3.log
}
lat $PWD new 1024 "1 8"
lat /tmp/base base 1024 "1 8"
lat /tmp/rank rank 1024 1
