#!/usr/bin/env bash
# Device call 87 (prepared, not run: no device time was left): form F of the two-launch MLA merge
# (merge_F.patch: form D with its loop over the live splits past 16 software-pipelined, three
# stages through cp.async) against the landed form A (main): the MLA GPU tests on F,
# mla_merge_probe.py on A and F (alternating), then the engine at batch 1 on F and A.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl .devrun/xd/*.whl
L=$OUT/logs; mkdir -p $L
NEW=$PWD
rm -rf /tmp/vF && mkdir /tmp/vF && cp -r vllm tests benchmarks pyproject.toml /tmp/vF/
(cd /tmp/vF && patch -p1 -s < $NEW/docs/perf_h200_2026-12-03f/merge_F.patch) || exit 1
(cd /tmp/vF && PYTHONPATH=/tmp/site:/tmp/vF timeout 100 python -m pytest -q -m gpu -n 4 -p no:cacheprovider \
  tests/models/kimi_k3/test_amd_mla_decode.py > $L/call87_gpu_tests.log 2>&1)
echo "tests rc $?"; tail -1 $L/call87_gpu_tests.log
probe() { # tree tag
  (cd $1 && PYTHONPATH=/tmp/site:$1 timeout 60 python $NEW/docs/perf_h200_2026-12-03f/mla_merge_probe.py \
    > /tmp/mla_$2.log 2>&1); echo "probe $2 rc $?"; grep -v -i warn /tmp/mla_$2.log
  echo "== $2" >> $L/call87_mla_merge.log; cat /tmp/mla_$2.log >> $L/call87_mla_merge.log
}
for i in 1 2; do probe $NEW A$i; probe /tmp/vF F$i; done
P='{"linear":"fp8_per_channel","ignore":["re:(?!.*self_attn\\.o_proj$).*"]}'
engine() { # tree tag limit
  (cd $1 && PYTHONPATH=/tmp/site:$1 timeout $3 python benchmarks/benchmark_latency.py --model kimi-linear-48b-a3b \
    --load-format dummy --skip-tokenizer-init --quantization-config "$P" --batch-sizes 1 --input-lens 1024 8192 \
    --output-len 16 --warmup-steps 2 --profile-steps 2 --max-num-batched-tokens 8192 \
    --output-json $L/call87_latency_$2.json > $L/call87_latency_$2.log 2>&1)
  echo "latency $2 rc $?"; grep -E "warm-up|decode \(graph" $L/call87_latency_$2.log
  grep -E "_mla_decode" $L/call87_latency_$2.log
}
engine /tmp/vF F 200
engine $NEW A 150
