#!/usr/bin/env bash
# Thirty-ninth run, call 143 (carry [".whl", ".devrun"]): the whole GPU suite on this tree, the
# first GPU run of test_cuda_graphs.py's steps-launched-ahead test in its tests/steps_ahead.py
# form (1b54ae2) and of the runner's TP > 1 asynchronous path at TP = 1 (aca1334); the two-GPU
# test skips on one GPU.
set -u
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl .devrun/xd/*.whl
export PYTHONPATH=/tmp/site:$PWD
timeout ${LIMIT:-500} python -m pytest -q -m gpu -n 4 -p no:cacheprovider --durations=15 tests \
  > $OUT/gpu_tests.log 2>&1
echo "gpu rc $?"; tail -30 $OUT/gpu_tests.log
