#!/usr/bin/env bash
# TP = 2, first call (prepared for kind nvidia-h200-x2, not run: that kind was not lent). Where
# the ~40 ms a step that TP = 2 added from batch 8 on in the third run (docs/performance.md,
# "TP = 2 on nvidia-h200-x2") goes: the all-reduce alone, eager and graph-replayed, then the
# engine at -tp 2 with the step profile (rank 0's kernels, the all-reduces among them).
# NVLink multicast stays off (KINDS.md). Since aca1334 asynchronous scheduling is on at -tp 2 too
# (the step launched ahead gets rank 0's sampled ids by a broadcast): each decode line also gives
# the step one at a time, the only form TP = 2 had before.
source "$(dirname "$0")/tp2_env.sh"
python3 -c 'import torch; print(torch.cuda.device_count(), "GPUs")'
nvidia-smi topo -m > $L/tp2_topology.txt 2>&1
timeout 120 python benchmarks/kernels/benchmark_all_reduce.py --tokens 1 8 64 256 \
  --csv $L/tp2_all_reduce.csv > $L/tp2_all_reduce.log 2>&1
echo "all-reduce rc $?"; cat $L/tp2_all_reduce.log
P='{"linear":"fp8_per_channel","ignore":["re:(?!.*self_attn\\.o_proj$).*"]}'
timeout 420 python benchmarks/benchmark_latency.py --model kimi-linear-48b-a3b --load-format dummy \
  --skip-tokenizer-init --quantization-config "$P" -tp 2 --batch-sizes 1 8 64 --input-lens 1024 \
  --output-len 16 --warmup-steps 2 --profile-steps 2 --max-num-batched-tokens 8192 \
  --time-budget-s 300 --output-json $L/tp2_latency.json > $L/tp2_latency.log 2>&1
echo "latency rc $?"; grep -E "copy_|warm-up|decode \(graph" $L/tp2_latency.log
