#!/usr/bin/env bash
# Prepared for the next session (not run: this session's device time was spent). Needs, besides
# .whl/ (fla-core): .devrun/router_base.py, the router.py before `tl.topk`:
#   git show 5f6b6ea:vllm/model_executor/layers/fused_moe/router.py > .devrun/router_base.py
# 1. The engine at batch 1 and 64 (1k and 8k) on this tree and with the sort-based router.py, one
#    machine: what 2f7bac2's 0.8-0.9 us a MoE layer (call 92, kernel benchmark) gives a step.
# 2. The top-k kernel's warps with `tl.topk` (4 beat 1 with the full sort; `_default_warps`).
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
L=$OUT/logs; mkdir -p $L
NEW=$PWD
rm -rf /tmp/vB && mkdir /tmp/vB && cp -r vllm benchmarks pyproject.toml /tmp/vB/
cp .devrun/router_base.py /tmp/vB/vllm/model_executor/layers/fused_moe/router.py
P='{"linear":"fp8_per_channel","ignore":["re:(?!.*self_attn\\.o_proj$).*"]}'
engine() { # tree tag limit
  (cd $1 && PYTHONPATH=/tmp/site:$1 timeout $3 python benchmarks/benchmark_latency.py --model kimi-linear-48b-a3b \
    --load-format dummy --skip-tokenizer-init --quantization-config "$P" --batch-sizes 1 64 \
    --input-lens 1024 8192 --output-len 16 --warmup-steps 2 --profile-steps 2 \
    --max-num-batched-tokens 8192 --output-json $L/router_latency_$2.json > $L/router_latency_$2.log 2>&1)
  echo "latency $2 rc $?"; grep -E "warm-up|decode \(graph" $L/router_latency_$2.log
  grep -E "_fused_router_topk_kernel|_grouped_topk_kernel" $L/router_latency_$2.log
}
engine $NEW new 260
engine /tmp/vB base 200
(PYTHONPATH=/tmp/site:$NEW timeout 60 python benchmarks/kernels/benchmark_router.py --warps 1 2 4 \
  --tokens 1 8 64 256 > $L/router_warps.log 2>&1; echo "warps rc $?"; grep -v -i warn $L/router_warps.log | tail -20)
