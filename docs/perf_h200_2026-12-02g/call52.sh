#!/usr/bin/env bash
# Device call 52 (final main): the fused op's host time with PDL and without; GPU tests of the
# KDA and MLA decode kernels (every launch now takes PDL).
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl .devrun/xd/*.whl
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site:$PWD
L=$OUT/logs; mkdir -p $L
for p in 1 0; do
  VLLM_TRITON_PDL=$p timeout 40 python benchmarks/kernels/benchmark_rmsnorm_gated_fp8_per_token.py --host-overhead \
    --no-fla >> $L/call52_host_pdl$p.log 2>&1
  echo "host $p rc $?" >> $L/rc.txt
done
timeout 100 python -m pytest -q -m gpu -p no:cacheprovider tests/models/kimi_k3/test_amd_fused_kda_decode.py \
  > $L/call52_gpu_tests_kda.log 2>&1
echo "kda rc $?" >> $L/rc.txt; pkill -f pytest
timeout 55 python -m pytest -q -m gpu -p no:cacheprovider tests/models/kimi_k3/test_amd_mla_decode.py \
  > $L/call52_gpu_tests_mla.log 2>&1
echo "mla rc $?" >> $L/rc.txt; pkill -f pytest
cd $OUT && tar czf logs.tgz logs && rm -rf logs
