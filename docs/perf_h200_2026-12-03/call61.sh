#!/usr/bin/env bash
# Device call 61: the engine at 1k, batch 1 / 8 / 64 / 256, with the previous KDA decode file
# (.devrun/base, c4e7a99) on a copy of the tree, then this tree again at batch 1, then the GPU
# tests call 60 did not reach (fla's kernels compile first).
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl .devrun/xd/*.whl
export PYTHONUNBUFFERED=1
L=$OUT/logs; mkdir -p $L
rm -rf /tmp/base && mkdir /tmp/base && tar cf - --exclude=.git . | tar xf - -C /tmp/base && cp -r .devrun/base/vllm /tmp/base/
PTPC='{"linear":"fp8_per_channel","ignore":["re:(?!.*self_attn\\.o_proj$).*"]}'
LAT="--model kimi-linear-48b-a3b --load-format dummy --skip-tokenizer-init --input-lens 1024 --output-len 16 --warmup-steps 2 --profile-steps 2 --max-num-batched-tokens 8192"
(cd /tmp/base && PYTHONPATH=/tmp/site:/tmp/base timeout 230 python benchmarks/benchmark_latency.py $LAT --batch-sizes 1 8 64 256 \
  --quantization-config "$PTPC" --output-json $L/call61_latency_base.json > $L/call61_latency_base.log 2>&1
 echo "lat base rc $?" >> $L/rc.txt)
(PYTHONPATH=/tmp/site:$PWD timeout 100 python benchmarks/benchmark_latency.py $LAT --batch-sizes 1 \
  --quantization-config "$PTPC" --output-json $L/call61_latency_new1.json > $L/call61_latency_new1.log 2>&1
 echo "lat new1 rc $?" >> $L/rc.txt)
(PYTHONPATH=/tmp/site:$PWD timeout 190 python -m pytest -q -m gpu -p no:cacheprovider \
  "tests/models/kimi_k3/test_amd_fused_kda_decode.py::test_gpu_lower_bound_gate_and_core_match_fla_in_kernel_gate" \
  tests/models/kimi_k3/test_amd_kda.py > $L/call61_gpu_tests.log 2>&1
 echo "tests rc $?" >> $L/rc.txt; pkill -f pytest)
cat $L/rc.txt
tail -15 $L/call61_gpu_tests.log | grep -v "^  "
for t in base new1; do echo "== $t"; grep -E "decode \(graph\)|KDA decode  |_fused_kda_decode_kernel|_kda_decode_epilogue|copy" $L/call61_latency_$t.log; done
cd $OUT && tar czf logs.tgz logs && rm -rf logs
