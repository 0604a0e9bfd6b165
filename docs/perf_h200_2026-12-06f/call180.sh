#!/usr/bin/env bash
# Forty-fifth run, any GPU (carry [".whl", ".devrun"]): the MLA prefill benchmark (q, k and v of
# a new prompt in one launch against torch's copies; the layer check now through the kernel the
# new path takes), the MoE GPU tests on the 256-wide down tiles of the 128-row TMA prefill set,
# and those tiles against the 128-wide ones at random routing (4096 and 8192 tokens).
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl .devrun/xd/*.whl
export PYTHONPATH=/tmp/site:$PWD
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
(cd benchmarks/kernels && timeout 150 python benchmark_mla_prefill.py --ctx 2048 4096 8192 \
  --csv $OUT/mla_prefill.csv > $OUT/mla_prefill.log 2>&1; echo "mla bench rc $?")
grep -v "^$\|Warn\|scaled_dot" $OUT/mla_prefill.log | tail -26
timeout 200 python -m pytest -q -m gpu -n 4 -p no:cacheprovider -rf --tb=short -W ignore \
  tests/model_executor/test_fused_moe.py > $OUT/moe_tests.log 2>&1
echo "moe tests rc $?"; tail -3 $OUT/moe_tests.log
(cd benchmarks/kernels && timeout 150 python benchmark_moe.py --paths tgrouped --tokens 4096 8192 \
  --fused-shared-experts 1 --timing flushed --tgrouped-configs \
  128+64/128,64,8,4/256,64,8,4/tma 128+64/128,64,8,4/128,64,8,3/tma \
  128+64/128,64,8,4/256,64,8,4/tma 128+64/128,64,8,4/128,64,8,3/tma \
  --csv $OUT/moe_random.csv > $OUT/moe_random.log 2>&1; echo "moe bench rc $?")
grep "T=" $OUT/moe_random.log | cut -c1-150
