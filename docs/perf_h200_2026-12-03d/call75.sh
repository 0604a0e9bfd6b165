#!/usr/bin/env bash
# Device call 75: the second reading's fixes (fdbfb2c) on the GPU: the launch path's GPU tests
# and the op's (C launch behind Triton 3.6's own CudaLauncher.__call__; the op's cache keyed by
# the PDL flag), the fused op's host time, and the prefill launch sites' probe.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
L=$OUT/logs; mkdir -p $L
export PYTHONPATH=/tmp/site:$PWD
timeout 100 python -m pytest -q -m gpu -p no:cacheprovider tests/triton_utils/test_launch.py \
  tests/models/kimi_k3/test_amd_kda_oproj_ptpc.py -k "launch or reuse or launched" > $L/call75_gpu_tests.log 2>&1
echo "tests rc $?"; tail -2 $L/call75_gpu_tests.log
timeout 60 taskset -c 3 python benchmarks/kernels/benchmark_rmsnorm_gated_fp8_per_token.py --host-overhead \
  --no-fla > $L/call75_host.log 2>&1; echo "host rc $?"; grep "^#" $L/call75_host.log
timeout 60 python docs/perf_h200_2026-12-03d/launch_sites.py > $L/call75_launch_sites.log 2>&1
echo "sites rc $?"; grep -v -i warn $L/call75_launch_sites.log
