#!/usr/bin/env bash
# Device call 84: how many splits the two-launch MLA merge loads before it knows which are live
# (`_EARLY_SPLITS` in mla_decode.py): all (A, 1024), none (B, 0: every load masked, waits for
# the length) or the first 16 (C). The MLA GPU tests on each, then mla_merge_probe.py on each
# and on 48aab7d, alternating processes.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl .devrun/xd/*.whl
L=$OUT/logs; mkdir -p $L
NEW=$PWD
rm -rf /tmp/base && cp -r .devrun/base /tmp/base
for v in A:1024 B:0 C:16; do
  t=/tmp/v${v%%:*}; rm -rf $t && mkdir $t && cp -r vllm tests benchmarks pyproject.toml $t/
  sed -i "s/^_EARLY_SPLITS = .*/_EARLY_SPLITS = ${v##*:}/" $t/vllm/models/kimi_k3/amd/ops/mla_decode.py
  grep "^_EARLY_SPLITS" $t/vllm/models/kimi_k3/amd/ops/mla_decode.py
done
for v in A B C; do
  (cd /tmp/v$v && PYTHONPATH=/tmp/site:/tmp/v$v timeout 120 python -m pytest -q -m gpu -n 4 -p no:cacheprovider \
    tests/models/kimi_k3/test_amd_mla_decode.py > $L/call84_gpu_tests_$v.log 2>&1)
  echo "tests $v rc $?"; tail -1 $L/call84_gpu_tests_$v.log
done
probe() { # tree tag
  (cd $1 && PYTHONPATH=/tmp/site:$1 timeout 100 python $NEW/docs/perf_h200_2026-12-03f/mla_merge_probe.py \
    > /tmp/mla_$2.log 2>&1); echo "probe $2 rc $?"; grep -v -i warn /tmp/mla_$2.log
  echo "== $2" >> $L/call84_mla_merge.log; cat /tmp/mla_$2.log >> $L/call84_mla_merge.log
}
for i in 1 2; do probe /tmp/base base$i; probe /tmp/vA A$i; probe /tmp/vB B$i; probe /tmp/vC C$i; done
