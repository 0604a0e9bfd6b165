#!/usr/bin/env bash
# Device call 64: ncu (full set, SASS stall samples) of the batch-1 decode kernels: MLA split and
# merge (1k context as in the engine), fused norm + router (T = 1), KDA decode (batch 1), MoE
# gate/up and down (T = 1).
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl .devrun/xd/*.whl
L=$OUT/logs; mkdir -p $L; R=/tmp/reps; mkdir -p $R
export PYTHONPATH=/tmp/site:$PWD
which ncu || export PATH=$PATH:/usr/local/cuda/bin
NCU="ncu --clock-control none --set full --import-source yes --sampling-interval 0 --launch-count 1"
run() { # name regex skip cmd...
  local name=$1 rx=$2 skip=$3; shift 3
  timeout 105 $NCU --kernel-name regex:$rx --launch-skip $skip -o $R/$name -f "$@" > $R/$name.run.log 2>&1
  echo "== $name rc $?"; tail -2 $R/$name.run.log
  python .devrun/ncu_top.py $R/$name.ncu-rep $R/$name.txt > /dev/null 2>&1; head -30 $R/$name.txt
}
run mla_split _mla_decode_split 3 python benchmarks/kernels/benchmark_mla_decode.py --batches 1 --contexts 1034 --capacity 1066 --block-size 16 --configs 16,64,8,5,c4 --splits 16 --merge two --graph-calls 1 --reps 2
run mla_merge _mla_decode_merge 3 python benchmarks/kernels/benchmark_mla_decode.py --batches 1 --contexts 1034 --capacity 1066 --block-size 16 --configs 16,64,8,5,c4 --splits 16 --merge two --graph-calls 1 --reps 2
run router _fused_router_topk 5 python benchmarks/kernels/benchmark_router.py --fused-norm --tokens 1 --graph-calls 1
run kda _fused_kda_decode 5 python benchmarks/kernels/benchmark_kda_decode.py --shapes kimi-linear --quantize --batches 1 --no-compare --variants v16w4 --graph-calls 1 --reps 2
run moe_gu _moe_gate_up 5 python benchmarks/kernels/benchmark_moe.py --paths triton --tokens 1 --fused-shared-experts 1 --graph-calls 1
cd $R && tar czf $L/call64_ncu_txt.tgz *.txt *.sass.csv *.run.log; ls -la $L
