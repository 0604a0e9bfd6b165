#!/usr/bin/env bash
# Prepared in the thirty-sixth run for the next lease (carry [".whl", ".devrun"]); fits an H100.
# Checks the batch-class launches (decode_batch_class): the GPU test that a mixed step's decode
# rows reuse the graphs' MLA decode kernels, then call 132's probe again on this tree (eager, so
# the decode kernels compile once a class, at about 1, 2, 3, 5 and 9 sequences, and at no other
# count; the conv's few int specializations stay).
# Second call: `PART=ab bash docs/perf_h200_2026-12-05e/call.sh`: the batch phase of 64 prompts
# of 8k with the decode launches by class, then by exact count (before af2246d), one machine.
# Third: `bash docs/perf_h200_2026-12-05e/call.sh`: on an H200 the grid, on an H100 call 131's
# host profile with graphs (mixed steps at ~134 ms, not 394-509).
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl .devrun/xd/*.whl
export PYTHONPATH=/tmp/site:$PWD
timeout 240 python -m pytest -q -rA -m gpu -p no:cacheprovider \
  "tests/v1/worker/test_cuda_graphs.py::test_mixed_steps_decode_rows_reuse_the_graphs_decode_kernels" \
  > $OUT/class_test.log 2>&1
echo "test rc $?"; grep -E "^(PASSED|FAILED|ERROR)|passed|failed|Error" $OUT/class_test.log | tail -20
PART=compiles LIMIT=240 bash docs/perf_h200_2026-12-05e/call.sh
