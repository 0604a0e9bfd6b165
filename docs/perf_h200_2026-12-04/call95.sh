#!/usr/bin/env bash
# Call 95: the whole GPU suite on this tree (the argmax's kernels up to 64 rows, one step a
# program), then the argmax benchmark around the 64-row crossover.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl .devrun/xd/*.whl
export PYTHONPATH=/tmp/site:$PWD
L=$OUT/logs; mkdir -p $L
(cd benchmarks/kernels && timeout 100 python benchmark_argmax.py --rows 1 8 32 64 96 128 256 \
  --target-programs 2048 8192 --csv $L/call95_argmax.csv > $L/call95_argmax.log 2>&1; \
  echo "argmax bench rc $?"; grep -E "copy|torch .* best|argmax\(\)" $L/call95_argmax.log)
timeout 470 python -m pytest -q -m gpu -n 4 --durations=20 tests > $L/call95_gpu_tests.log 2>&1
echo "gpu suite rc $?"; tail -25 $L/call95_gpu_tests.log
