#!/usr/bin/env bash
# Device call 83: the two-launch MLA merge reading every split in one round trip, with the
# selects on the loaded values (fma at every split count): the MLA GPU tests, the kernel A/B
# against 48aab7d (mla_merge_probe.py, alternating processes), then the engine at batch 1.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl .devrun/xd/*.whl
L=$OUT/logs; mkdir -p $L
NEW=$PWD
export PYTHONPATH=/tmp/site:$NEW
timeout 150 python -m pytest -q -m gpu -p no:cacheprovider tests/models/kimi_k3/test_amd_mla_decode.py > $L/call83_gpu_tests.log 2>&1
echo "tests rc $?"; tail -3 $L/call83_gpu_tests.log
rm -rf /tmp/base && cp -r .devrun/base /tmp/base
probe() { # tree tag
  (cd $1 && PYTHONPATH=/tmp/site:$1 timeout 150 python $NEW/docs/perf_h200_2026-12-03f/mla_merge_probe.py \
    > /tmp/mla_$2.log 2>&1); echo "probe $2 rc $?"; grep -v -i warn /tmp/mla_$2.log
  echo "== $2" >> $L/call83_mla_merge.log; cat /tmp/mla_$2.log >> $L/call83_mla_merge.log
}
for i in 1 2; do probe /tmp/base base$i; probe $NEW new$i; done
P='{"linear":"fp8_per_channel","ignore":["re:(?!.*self_attn\\.o_proj$).*"]}'
timeout 240 python benchmarks/benchmark_latency.py --model kimi-linear-48b-a3b --load-format dummy \
  --skip-tokenizer-init --quantization-config "$P" --batch-sizes 1 --input-lens 1024 8192 \
  --output-len 16 --warmup-steps 2 --profile-steps 2 --max-num-batched-tokens 8192 \
  --output-json $L/call83_latency.json > $L/call83_latency.log 2>&1
echo "latency rc $?"; grep -E "copy_|warm-up|decode \(graph" $L/call83_latency.log
grep -A9 "B=1: device time per decode step" $L/call83_latency.log | grep -E "MLA|group"
