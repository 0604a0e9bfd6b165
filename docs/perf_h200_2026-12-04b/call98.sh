#!/usr/bin/env bash
# Device call 98: every other kernel benchmark that kernel_bench.py touched, once at small sizes on
# the GPU (exit code and the copy line).
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
L=$OUT/logs; mkdir -p $L
export PYTHONPATH=/tmp/site:$PWD
cd benchmarks/kernels
run() { local name=$1; shift; timeout 45 python "$@" > $L/call98_$name.log 2>&1; echo "$name rc $? $(grep -m1 -E 'copy' $L/call98_$name.log | cut -c1-90)"; }
run kda benchmark_kda_decode.py --shapes kimi-linear --batches 1 64 --no-compare --no-unfused --csv $L/call98_kda.csv
run gemv benchmark_gemv.py --shapes o_proj --m 1 2 --csv $L/call98_gemv.csv
run gemv_batched benchmark_gemv_batched.py --m 1 --csv $L/call98_gemv_batched.csv
run moe benchmark_moe.py --tokens 1 64 --paths triton
run router benchmark_router.py --tokens 1 --fused-norm
run conv benchmark_causal_conv1d.py --tokens 8192 --seqs 1 --configs default --reps 10
run mla_prefill benchmark_mla_prefill.py --ctx 8192 --reps 10
run rmsnorm benchmark_rmsnorm_gated_fp8_per_token.py --tokens 1 1024 --heads 32 --no-fla
run triton_launch benchmark_triton_launch.py
