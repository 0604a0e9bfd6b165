#!/usr/bin/env bash
# Device call 103: GPU tests of the conv's q/k normalisation, the KDA core without fla's own, and the
# grouped experts' tail tiles; then the 8k prefill on this tree (b54d918) and on 49f3898 (the tail
# tiles without the conv's normalisation; .devrun/base holds its vllm/ and benchmarks/).
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl .devrun/xd/*.whl
export PYTHONPATH=/tmp/site:$PWD
timeout 200 python -m pytest -q -m gpu -n 4 -p no:cacheprovider tests/models/kimi_k3/test_amd_causal_conv1d.py \
  tests/models/kimi_k3/test_amd_kda.py tests/model_executor/test_fused_moe.py -k "conv or normaliz or tail or tma or grouped" \
  > $OUT/c103_tests.log 2>&1
echo "tests rc $?"; grep -E "passed|failed|FAILED|Error" $OUT/c103_tests.log | head -12
P='{"linear":"fp8_per_channel","ignore":["re:(?!.*self_attn\\.o_proj$).*"]}'
A=(--model kimi-linear-48b-a3b --load-format dummy --skip-tokenizer-init --quantization-config "$P" --batch-sizes 1
   --input-lens 8192 --output-len 4 --warmup-steps 1 --profile-prefill --max-num-batched-tokens 8192)
timeout 160 python benchmarks/benchmark_latency.py "${A[@]}" --output-json $OUT/c103_new.json > $OUT/c103_new.log 2>&1
echo "new rc $?"; grep -E "single prompt|\(batch\)|  KDA prefill|routed experts  |other \(|device busy|l2norm|conv1d_prefill|decode \(graph" $OUT/c103_new.log | head -12
(cd .devrun/base && PYTHONPATH=/tmp/site:$PWD timeout 110 python benchmarks/benchmark_latency.py "${A[@]}" --output-json $OUT/c103_base.json > $OUT/c103_base.log 2>&1)
echo "base rc $?"; grep -E "single prompt|\(batch\)|  KDA prefill|routed experts  |other \(|device busy|l2norm|conv1d_prefill|decode \(graph" $OUT/c103_base.log | head -12
timeout 90 python benchmarks/benchmark_latency.py "${A[@]}" --output-json $OUT/c103_new2.json > $OUT/c103_new2.log 2>&1
echo "new2 rc $?"; grep -E "single prompt|\(batch\)|  KDA prefill|device busy" $OUT/c103_new2.log | head -5
