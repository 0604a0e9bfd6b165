#!/usr/bin/env bash
# Forty-fifth run, the last call (not run: no machine; now next_calls.sh PART=gpu), any GPU
# (carry [".whl", ".devrun"]): the MLA prefill GPU tests on c679e50 (the second reading's changes
# to mla_prefill_dense_operands), the MoE SiTU GPU tests on d2dde5c, the operands at 8192 tokens
# once more, then the one-token-path (GEMV) tiles at Kimi-K3's TP-8 expert shapes, where 2 tokens
# read at 76.8% of copy against 85.2% at 1 (call 177): the default against neighbours (first
# and last: the default, for the spread).
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl .devrun/xd/*.whl
export PYTHONPATH=/tmp/site:$PWD
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
timeout 90 python -m pytest -q -m gpu -p no:cacheprovider -rf --tb=short -W ignore \
  tests/models/kimi_k3/test_amd_mla_prefill.py > $OUT/mla_tests.log 2>&1
echo "mla tests rc $?"; tail -2 $OUT/mla_tests.log
# d2dde5c: the SiTU branch of gated_product chosen by a named constexpr.
timeout 150 python -m pytest -q -m gpu -p no:cacheprovider -rf --tb=short -W ignore \
  tests/model_executor/test_fused_moe.py -k "situ or SiTU" > $OUT/moe_situ_tests.log 2>&1
echo "moe situ tests rc $?"; tail -2 $OUT/moe_situ_tests.log
cd benchmarks/kernels
timeout 40 python benchmark_mla_prefill.py --ctx 8192 --csv $OUT/mla_prefill.csv \
  > $OUT/mla_prefill.log 2>&1; echo "mla bench rc $?"; grep "operands\|bit for bit" $OUT/mla_prefill.log
timeout 70 python benchmark_moe.py --shape kimi-k3-tp8 --paths triton --activation situ \
  --tokens 2 --triton-configs 8,256,4/2,512,2 8,256,4/1,512,1 8,256,4/4,512,4 \
  8,256,4/2,256,2 16,256,4/2,512,2 8,512,4/2,512,2 8,256,4u/2,512,2 8,256,4/2,512,2 \
  --csv $OUT/k3_gemv_t2.csv > $OUT/k3_gemv_t2.log 2>&1
echo "T=2 rc $?"; grep "T=" $OUT/k3_gemv_t2.log | cut -c1-110
