#!/usr/bin/env bash
# Device call 99: MLA decode of one long sequence, more splits than the rule's (64-66) at 8k-32k.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
L=$OUT/logs; mkdir -p $L
export PYTHONPATH=/tmp/site:$PWD
cd benchmarks/kernels
for ctx in 8192 16384 32768; do
  timeout 60 python benchmark_mla_decode.py --batches 1 --contexts $ctx --capacity $((ctx + 32)) --block-size 16 \
    --configs 16,64,8,5,c4 32,64,8,5,c4 --splits 48 64 66 96 128 --merge two \
    --csv $L/call99_mla_$ctx.csv > $L/call99_mla_$ctx.log 2>&1; echo "ctx $ctx rc $?"
  grep -h "heuristic" $L/call99_mla_$ctx.log | cut -c1-200
done
