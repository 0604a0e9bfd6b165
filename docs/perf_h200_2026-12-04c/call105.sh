#!/usr/bin/env bash
# Device call 105: the 8k prefill with fla-core applying the KDA gate (this tree), without it
# (.devrun/base: the tree before, 6a47105), and with the conv kernel's q/k normalisation in fla's
# approximate form (.devrun/convnorm: 6a47105 + b54d918 with 1 / tl.sqrt); the KDA layer's GPU tests.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl .devrun/xd/*.whl
P='{"linear":"fp8_per_channel","ignore":["re:(?!.*self_attn\\.o_proj$).*"]}'
A=(--model kimi-linear-48b-a3b --load-format dummy --skip-tokenizer-init --quantization-config "$P" --batch-sizes 1
   --input-lens 8192 --output-len 4 --warmup-steps 1 --profile-prefill --max-num-batched-tokens 8192)
G="single prompt|\(batch\)|  KDA prefill|other \(|device busy|_kda_gate_beta|cumsum|l2norm_fwd|conv1d_prefill_kernel|kda_gate_chunk"
run() {  # name, dir, timeout
  (cd $2 && PYTHONPATH=/tmp/site:$PWD timeout $3 python benchmarks/benchmark_latency.py "${A[@]}" \
    --output-json $OUT/c105_$1.json > $OUT/c105_$1.log 2>&1)
  echo "$1 rc $?"; grep -E "$G" $OUT/c105_$1.log | grep -v "gaps\|^ *[0-9]* *1 " | head -12
}
run new . 150
run base .devrun/base 90
export PYTHONPATH=/tmp/site:$PWD
timeout 100 python -m pytest -q -m gpu -n 4 -p no:cacheprovider tests/models/kimi_k3/test_amd_kda.py \
  tests/models/kimi_k3/test_amd_kda_gate.py > $OUT/c105_tests.log 2>&1
echo "tests rc $?"; grep -E "passed|failed|FAILED" $OUT/c105_tests.log | head
run convnorm .devrun/convnorm 90
