#!/usr/bin/env bash
# Device call 87 (prepared in the twenty-second run, run in the twenty-third on cc2780f). Needs,
# besides .whl/ (fla-core) and .devrun/xd/ (pytest-xdist, execnet wheels):
# .devrun/mla_decode_A.py, made with
#   git show 9a48158:vllm/models/kimi_k3/amd/ops/mla_decode.py > .devrun/mla_decode_A.py
# 1. 7e9ceda's MLA merge (at most 66 splits unrolled, the rest in a loop over the live ones; -0 for
#    dead splits; explicit FP contraction) on the GPU: the MLA GPU tests.
# 2. mla_merge_probe.py on A (9a48158's merge), this tree and form F (merge_F.patch: 16 splits
#    unrolled, the loop past them pipelined in three stages), alternating processes.
# 3. The engine at batch 1 on this tree and on F.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl .devrun/xd/*.whl
L=$OUT/logs; mkdir -p $L
NEW=$PWD
rm -rf /tmp/vA /tmp/vF && mkdir /tmp/vA /tmp/vF
cp -r vllm benchmarks pyproject.toml /tmp/vA/ && cp .devrun/mla_decode_A.py /tmp/vA/vllm/models/kimi_k3/amd/ops/mla_decode.py
cp -r vllm benchmarks pyproject.toml /tmp/vF/ && (cd /tmp/vF && patch -p1 -s < $NEW/docs/perf_h200_2026-12-03f/merge_F.patch) || exit 1
export PYTHONPATH=/tmp/site:$NEW
timeout 100 python -m pytest -q -m gpu -n 4 -p no:cacheprovider tests/models/kimi_k3/test_amd_mla_decode.py > $L/call87_gpu_tests.log 2>&1
echo "tests rc $?"; tail -1 $L/call87_gpu_tests.log
probe() { # tree tag
  (cd $1 && PYTHONPATH=/tmp/site:$1 timeout 60 python $NEW/docs/perf_h200_2026-12-03f/mla_merge_probe.py \
    > /tmp/mla_$2.log 2>&1); echo "probe $2 rc $?"; grep -v -i warn /tmp/mla_$2.log
  echo "== $2" >> $L/call87_mla_merge.log; cat /tmp/mla_$2.log >> $L/call87_mla_merge.log
}
for i in 1 2; do probe /tmp/vA A$i; probe $NEW main$i; probe /tmp/vF F$i; done
P='{"linear":"fp8_per_channel","ignore":["re:(?!.*self_attn\\.o_proj$).*"]}'
engine() { # tree tag limit
  (cd $1 && PYTHONPATH=/tmp/site:$1 timeout $3 python benchmarks/benchmark_latency.py --model kimi-linear-48b-a3b \
    --load-format dummy --skip-tokenizer-init --quantization-config "$P" --batch-sizes 1 --input-lens 1024 8192 \
    --output-len 16 --warmup-steps 2 --profile-steps 2 --max-num-batched-tokens 8192 \
    --output-json $L/call87_latency_$2.json > $L/call87_latency_$2.log 2>&1)
  echo "latency $2 rc $?"; grep -E "warm-up|decode \(graph" $L/call87_latency_$2.log
  grep -E "_mla_decode" $L/call87_latency_$2.log
}
engine $NEW main 200
engine /tmp/vF F 150
