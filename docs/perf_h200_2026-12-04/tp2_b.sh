#!/usr/bin/env bash
# TP = 2, second call (prepared for kind nvidia-h200-x2, not run: that kind was not lent): the
# greedy tokens of TP = 2 against TP = 1 on the dummy 48B model. Each TP size runs in its own
# process (fla compiles its kernels per head count: about 100 s each in the third run).
source "$(dirname "$0")/tp2_env.sh"
P='{"linear":"fp8_per_channel","ignore":["re:(?!.*self_attn\\.o_proj$).*"]}'
timeout 560 python benchmarks/benchmark_tp_greedy.py --model kimi-linear-48b-a3b --load-format dummy \
  --skip-tokenizer-init --quantization-config "$P" --tp-sizes 1 2 --num-prompts 64 --input-len 256 \
  --output-len 32 --runs-dir $L/tp_runs --output-json $L/tp2_greedy.json > $L/tp2_greedy.log 2>&1
echo "greedy rc $?"; tail -20 $L/tp2_greedy.log
