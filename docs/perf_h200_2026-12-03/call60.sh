#!/usr/bin/env bash
# Device call 60: GPU tests of the fused KDA decode and the KDA layer (the single kernel's tile
# back after its sums), then the engine at 1k, batch 1 / 8 / 64 / 256, with this tree.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl .devrun/xd/*.whl
export PYTHONUNBUFFERED=1
L=$OUT/logs; mkdir -p $L
PTPC='{"linear":"fp8_per_channel","ignore":["re:(?!.*self_attn\\.o_proj$).*"]}'
LAT="--model kimi-linear-48b-a3b --load-format dummy --skip-tokenizer-init --input-lens 1024 --output-len 16 --warmup-steps 2 --profile-steps 2 --max-num-batched-tokens 8192"
(PYTHONPATH=/tmp/site:$PWD timeout 220 python -m pytest -q -m gpu -p no:cacheprovider -x \
  tests/models/kimi_k3/test_amd_fused_kda_decode.py tests/models/kimi_k3/test_amd_kda.py > $L/call60_gpu_tests.log 2>&1
 echo "tests rc $?" >> $L/rc.txt; pkill -f pytest)
(PYTHONPATH=/tmp/site:$PWD timeout 270 python benchmarks/benchmark_latency.py $LAT --batch-sizes 1 8 64 256 \
  --quantization-config "$PTPC" --output-json $L/call60_latency_new.json > $L/call60_latency_new.log 2>&1
 echo "lat new rc $?" >> $L/rc.txt)
cat $L/rc.txt
tail -15 $L/call60_gpu_tests.log | grep -v "^  "
grep -E "decode \(graph\)|KDA decode  |_fused_kda_decode_kernel|_kda_decode_epilogue|copy" $L/call60_latency_new.log
cd $OUT && tar czf logs.tgz logs && rm -rf logs
