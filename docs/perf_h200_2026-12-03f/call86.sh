#!/usr/bin/env bash
# Device call 86: the MLA merge with its first 16 splits loaded before the length is known and
# the rest in a loop over the live ones only (D, this tree) against the fully unrolled merge (A,
# 9a48158) and the chunked loop before it (48aab7d): the MLA GPU tests on D, the engine at batch 1
# on D and 48aab7d, mla_merge_probe.py on A and D (alternating), then the engine on A.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl .devrun/xd/*.whl
L=$OUT/logs; mkdir -p $L
NEW=$PWD
rm -rf /tmp/base /tmp/vA && cp -r .devrun/base /tmp/base
mkdir /tmp/vA && cp -r vllm benchmarks pyproject.toml /tmp/vA/ && cp .devrun/mla_decode_A.py /tmp/vA/vllm/models/kimi_k3/amd/ops/mla_decode.py
export PYTHONPATH=/tmp/site:$NEW
timeout 100 python -m pytest -q -m gpu -n 4 -p no:cacheprovider tests/models/kimi_k3/test_amd_mla_decode.py > $L/call86_gpu_tests.log 2>&1
echo "tests rc $?"; tail -1 $L/call86_gpu_tests.log
probe() { # tree tag
  (cd $1 && PYTHONPATH=/tmp/site:$1 timeout 60 python $NEW/docs/perf_h200_2026-12-03f/mla_merge_probe.py \
    > /tmp/mla_$2.log 2>&1); echo "probe $2 rc $?"; grep -v -i warn /tmp/mla_$2.log
  echo "== $2" >> $L/call86_mla_merge.log; cat /tmp/mla_$2.log >> $L/call86_mla_merge.log
}
P='{"linear":"fp8_per_channel","ignore":["re:(?!.*self_attn\\.o_proj$).*"]}'
engine() { # tree tag limit
  (cd $1 && PYTHONPATH=/tmp/site:$1 timeout $3 python benchmarks/benchmark_latency.py --model kimi-linear-48b-a3b \
    --load-format dummy --skip-tokenizer-init --quantization-config "$P" --batch-sizes 1 --input-lens 1024 8192 \
    --output-len 16 --warmup-steps 2 --profile-steps 2 --max-num-batched-tokens 8192 \
    --output-json $L/call86_latency_$2.json > $L/call86_latency_$2.log 2>&1)
  echo "latency $2 rc $?"; grep -E "warm-up|decode \(graph" $L/call86_latency_$2.log
  grep -E "_mla_decode" $L/call86_latency_$2.log
}
engine $NEW D 200
engine /tmp/base base 150
for i in 1 2; do probe /tmp/vA A$i; probe $NEW D$i; done
engine /tmp/vA A 150
