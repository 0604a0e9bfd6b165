#!/usr/bin/env bash
# Forty-fourth run, call 171 (carry [".whl", ".devrun"]): fla-core's `safe_gate` path for
# lower-bounded (Kimi-K3) gates.
# 1. GPU tests: the gate applied by fla-core (safe path against the precomputed decay through the
#    plain path), the prefill graphs bit for bit against the eager core with and without a lower
#    bound, the engine's greedy tokens with and without the graphs (kimi-k3-tiny: bounded gate),
#    the KDA layer's GPU tests.
# 2. benchmark_kda_prefill.py: softplus / bounded (safe) / bounded without safe_gate, us a call
#    (graph replay), 32 heads (Kimi-Linear TP 1) and 12 (Kimi-K3 TP 8), 1k-8k tokens.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl .devrun/xd/*.whl
export PYTHONPATH=/tmp/site:$PWD
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
python -c "import torch, triton; print(torch.__version__, triton.__version__)"
timeout 300 python -m pytest -q -m gpu -n 4 -p no:cacheprovider \
  tests/models/kimi_k3/test_amd_kda.py tests/models/kimi_k3/test_amd_kda_prefill_graphs.py \
  tests/models/kimi_k3/test_amd_fused_kda_decode.py > $OUT/gpu_tests.log 2>&1
echo "tests rc $?"; tail -3 $OUT/gpu_tests.log
cd benchmarks/kernels
timeout 270 python benchmark_kda_prefill.py --tokens 1024 2048 8192 --heads 32 12 \
  --csv $OUT/kda_prefill.csv > $OUT/kda_prefill.log 2>&1
echo "bench rc $?"; cat $OUT/kda_prefill.log | tail -12
