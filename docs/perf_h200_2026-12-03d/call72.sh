#!/usr/bin/env bash
# Device call 72: the launch path's C launcher (Triton 3.6) and the fused op's one-lookup call:
# GPU tests of the launch path, the fused op, the GEMV and MLA (the nineteenth run's final tree,
# never run on the GPU); the fused op's host time against main (490e218), alternating; the probe.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
L=$OUT/logs; mkdir -p $L
export PYTHONPATH=/tmp/site:$PWD
rm -rf /tmp/base && mkdir /tmp/base && cp -r .devrun/base/vllm .devrun/base/benchmarks /tmp/base/
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
python -c "import torch, triton; print(torch.__version__, triton.__version__)"
host() { # tree tag
  (cd $1 && PYTHONPATH=/tmp/site:$1 timeout 100 python benchmarks/kernels/benchmark_rmsnorm_gated_fp8_per_token.py \
    --host-overhead --no-fla > /tmp/host_$2.log 2>&1); echo "host $2 rc $?"; grep "^#" /tmp/host_$2.log
  cat /tmp/host_$2.log >> $L/call72_host.log
}
host $PWD new1; host /tmp/base base1; host $PWD new2; host /tmp/base base2
timeout 60 python docs/perf_h200_2026-12-03d/launch_parts.py > $L/call72_launch_parts.log 2>&1
echo "parts rc $?"; cat $L/call72_launch_parts.log
timeout 330 python -m pytest -q -m gpu -p no:cacheprovider -rf tests/triton_utils/test_launch.py \
  tests/models/kimi_k3/test_amd_kda_oproj_ptpc.py tests/kernels/linear/test_gemv.py \
  tests/models/kimi_k3/test_amd_mla.py tests/models/kimi_k3/test_amd_moe.py \
  tests/models/kimi_k3/test_amd_fused_kda_decode.py > $L/call72_gpu_tests.log 2>&1
echo "tests rc $?"; tail -8 $L/call72_gpu_tests.log
