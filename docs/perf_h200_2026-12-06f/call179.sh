#!/usr/bin/env bash
# Forty-fifth run, any GPU (carry [".whl", ".devrun"]): the MLA prefill GPU tests on
# mla_prefill_dense_operands (q, k and v of a new prompt in one launch for cuDNN's
# per-length-class plans; not yet run on a GPU), its kernel benchmark against torch's copies,
# then the grouped experts' 256-wide down tiles on the engine's routing (PART=moehist of the
# forty-third run's script).
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl .devrun/xd/*.whl
export PYTHONPATH=/tmp/site:$PWD
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
timeout 150 python -m pytest -q -m gpu -p no:cacheprovider -rf --tb=short -W ignore \
  tests/models/kimi_k3/test_amd_mla_prefill.py > $OUT/mla_tests.log 2>&1
echo "mla tests rc $?"; tail -3 $OUT/mla_tests.log
(cd benchmarks/kernels && timeout 150 python benchmark_mla_prefill.py --ctx 2048 4096 8192 \
  --csv $OUT/mla_prefill.csv > $OUT/mla_prefill.log 2>&1; echo "mla bench rc $?")
grep -v "^$" $OUT/mla_prefill.log | tail -24
PART=moehist timeout 330 bash docs/perf_h200_2026-12-06d/next_calls.sh 2>&1 | tail -8
