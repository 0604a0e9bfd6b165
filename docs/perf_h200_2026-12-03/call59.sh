#!/usr/bin/env bash
# Device call 59: the fused KDA decode with every load issued first. GPU tests of the op and the
# layer, and the kernel benchmark (variants at the engine's call, gate projections), against the
# previous kernel file (.devrun/base) on the same machine.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl .devrun/xd/*.whl
export PYTHONUNBUFFERED=1
L=$OUT/logs; mkdir -p $L
rm -rf /tmp/base && mkdir /tmp/base && tar cf - --exclude=.git . | tar xf - -C /tmp/base && cp -r .devrun/base/vllm /tmp/base/
tdir() { [ $1 = base ] && echo /tmp/base || echo $PWD; }
(PYTHONPATH=/tmp/site:$PWD timeout 130 python -m pytest -q -m gpu -p no:cacheprovider \
  tests/models/kimi_k3/test_amd_fused_kda_decode.py tests/models/kimi_k3/test_amd_kda.py > $L/call59_gpu_tests.log 2>&1
 echo "tests rc $?" >> $L/rc.txt; pkill -f pytest)
for tree in new base; do
  d=$(tdir $tree)
  (cd $d && PYTHONPATH=/tmp/site:$d timeout 75 python benchmarks/kernels/benchmark_kda_decode.py --shapes kimi-linear \
     --quantize --batches 1 8 64 256 --no-compare --variants v16w4 v64w4 v64w4x > $L/call59_kda_$tree.log 2>&1
   echo "kda $tree rc $?" >> $L/rc.txt)
  (cd $d && PYTHONPATH=/tmp/site:$d timeout 60 python benchmarks/kernels/benchmark_kda_decode.py --gate-proj \
     --shapes kimi-linear --quantize --batches 1 8 16 > $L/call59_gateproj_$tree.log 2>&1
   echo "gateproj $tree rc $?" >> $L/rc.txt)
done
cat $L/rc.txt
tail -3 $L/call59_gpu_tests.log
for t in new base; do echo "== kda $t"; tail -22 $L/call59_kda_$t.log; echo "== gateproj $t"; tail -8 $L/call59_gateproj_$t.log; done
cd $OUT && tar czf logs.tgz logs && rm -rf logs
