#!/usr/bin/env bash
# Device call 97: the kernel benchmarks on kernel_bench.py (their dry-run tests on the GPU, three
# scripts timed), and MLA decode in 64-head blocks (one warpgroup's wgmma, heads 32..63 masked)
# against the default launches.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl .devrun/xd/*.whl
L=$OUT/logs; mkdir -p $L
export PYTHONPATH=/tmp/site:$PWD
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $L/env.txt
python -c "import torch, triton; print(torch.__version__, triton.__version__)" >> $L/env.txt
timeout 170 python -m pytest -q -n 8 -p no:cacheprovider tests/benchmarks/test_kernel_benchmarks_dry_run.py > $L/call97_bench_tests.log 2>&1
echo "bench tests rc $?"; tail -3 $L/call97_bench_tests.log
cd benchmarks/kernels
timeout 40 python benchmark_argmax.py --rows 1 64 --target-programs 8192 > $L/call97_argmax.log 2>&1; echo "argmax rc $?"
timeout 40 python benchmark_gather_rows.py --tokens 1024 --reps 20 > $L/call97_gather.log 2>&1; echo "gather rc $?"
C="16,64,8,5,c4 32,64,8,5,c4 64,64,4,2,c4 64,64,4,3,c4 64,32,4,3,c4 64,64,8,2,c4 64,64,4,2"
timeout 100 python benchmark_mla_decode.py --batches 1 --contexts 8192 --capacity 8224 --block-size 16 \
  --configs $C --splits 33 64 --merge two --csv $L/call97_mla_b1.csv > $L/call97_mla_b1.log 2>&1; echo "mla b1 rc $?"
timeout 110 python benchmark_mla_decode.py --batches 8 64 --contexts 8192 --capacity 8224 --block-size 16 \
  --configs 32,64,8,5,c4 64,64,4,2,c4 64,64,4,3,c4 64,64,8,2,c4 --splits 2 4 16 --merge two \
  --csv $L/call97_mla_b64.csv > $L/call97_mla_b64.log 2>&1; echo "mla b8/64 rc $?"
tail -25 $L/call97_mla_b1.log; tail -30 $L/call97_mla_b64.log
