#!/usr/bin/env bash
# TP = 2, the GPU tests (prepared for kind nvidia-h200-x2, not run: that kind was not lent): the
# two-GPU test (kimi-k3-tiny, NCCL, CUDA graphs, the PTPC recipe: asynchronous scheduling at TP = 2
# gives the tokens of steps one at a time, fed by the broadcast of rank 0's sampled ids, aca1334),
# then every other GPU test on the two GPUs. NVLink multicast stays off (KINDS.md).
source "$(dirname "$0")/tp2_env.sh"
timeout 240 python -m pytest -q -p no:cacheprovider tests/v1/worker/test_tp2_gpu.py \
  > $L/tp2_gpu_test.log 2>&1
echo "tp2 gpu test rc $?"; tail -3 $L/tp2_gpu_test.log
timeout 330 python -m pytest -q -m gpu -n 4 -p no:cacheprovider tests \
  --deselect tests/v1/worker/test_tp2_gpu.py > $L/gpu_tests.log 2>&1
echo "gpu suite rc $?"; tail -5 $L/gpu_tests.log
