#!/usr/bin/env bash
# Forty-ninth run's device calls (carry [".whl", ".devrun"]). One PART per call:
#   sweep (~2 min, an H200) the bf16 GEMV's tiles at one and two rows on the step's large input
#         projections (call 194: KDA's q/k/v 2304 -> 12448 at 15.41 us in 16-channel, 256-wide,
#         8-warp tiles against cuBLAS's 17.71, MLA's q | kv_a at 9.72 against 11.88 in the
#         default tiles; the other M = 1 rows of qkv were cut from the returned output);
#   ab    (~3 min, any GPU; .devrun/old holds `git archive b528cce vllm benchmarks`, call 148's
#         tree) call 195's grid read batch 64 / 256 steps 1.4-3.3% slower than call 148's, and
#         the changes since touched the routed experts' kernels (d5b8939's activation epilogues,
#         c8abfd4's launches): the grouped Triton path at the decode batches' rows, each tree in
#         its own process, old / new / old / new;
#   engine (~6 min, an H200, or an H100 with 128 of the experts; .devrun/base holds `git archive d30d019 vllm benchmarks`, the tree
#         before the one-row GEMV change) batch-1 decode at 1k and 8k, the wide tile (new), the
#         tree before (base), the new tree with the default tiles only (WIDE_MIN_N past every N),
#         then new and base again; KDA prefill graphs off (start-up time, not measured here);
#   tests (~1 min, any GPU) the GEMV's GPU tests (the one-row dispatch and the wide tile);
#   short (~1 min, any GPU) the one-row defaults against cuBLAS at the three shapes it moves.
set -u
case "${PART:-sweep}" in
  sweep)
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
    PYTHONPATH=/tmp/site:$PWD timeout 400 python benchmarks/kernels/benchmark_gemv.py --dtypes bf16 \
      --shapes qkv mla_q_kv_a dense_down --m 1 2 --configs default 2,2048,4,1,1 \
      4,1024,4,1,1 8,512,4,1,1 8,256,4,1,1 16,256,4,1,1 16,256,8,1,1 16,512,8,1,1 32,256,8,1,1 \
      16,128,4,1,1 --csv $OUT/sweep.csv > $OUT/sweep.log 2>&1
    echo "sweep rc $?"; grep "of copy\|speed-up\|  1 \|  2 " $OUT/sweep.log | sed 's/  */ /g' | cut -c1-80 ;;
  ab)
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
    for label in old new old new; do
      tree=$PWD; [ $label = old ] && tree=$PWD/.devrun/old
      (cd $tree/benchmarks/kernels && PYTHONPATH=/tmp/site:$tree timeout 100 python \
        benchmark_moe.py --shape kimi-linear --fused-shared-experts 1 --paths tgrouped \
        --tokens 8 64 256 2>&1 | grep "T=" | cut -c1-100 | sed "s|^|$label: |")
    done ;;
  engine)
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
    P='{"linear":"fp8_per_channel","ignore":["re:(?!.*self_attn\\.o_proj$).*"]}'
    AB=$PWD/docs/perf_h200_2026-12-06i/ab_latency.py
    MODEL=kimi-linear-48b-a3b
    if [ "$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1)" -lt 100000 ]; then
      # An H100: the 48B config with 128 of its 256 experts (as call 191).
      mkdir -p /tmp/k128 && python3 -c "
import json; c = json.load(open('vllm/models/kimi_k3/config_only/kimi-linear-48b-a3b/config.json'))
c['num_experts'] = 128; json.dump(c, open('/tmp/k128/config.json', 'w'))"
      MODEL=/tmp/k128
    fi
    run() {
      label=$1; tree=$2; shift 2
      (cd $tree && env "$@" PYTHONPATH=/tmp/site:$tree VLLM_KDA_PREFILL_GRAPHS=0 TQDM_DISABLE=1 \
        timeout 300 python $AB --model $MODEL --load-format dummy --skip-tokenizer-init \
        --quantization-config "$P" --batch-sizes 1 --input-lens 1024 8192 --output-len 32 \
        --warmup-steps 4 --max-num-batched-tokens 8192 > $OUT/engine_$label.log 2>&1
       echo "$label rc $?"; grep "decode (graph)\|engine start" $OUT/engine_$label.log | cut -c1-150)
    }
    for label in ${RUNS:-new1 base1 default1 new2 base2}; do
      case $label in
        new*) run $label $PWD ;;
        base*) run $label $PWD/.devrun/base ;;
        default*) run $label $PWD WIDE_MIN_N=1000000000 ;;
      esac
    done ;;
  tests)
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
    PYTHONPATH=/tmp/site:$PWD timeout 180 python -m pytest -q -m gpu -p no:cacheprovider \
      tests/kernels/linear/test_gemv.py > $OUT/gemv_gpu.log 2>&1
    echo "gemv gpu tests rc $?"; tail -3 $OUT/gemv_gpu.log ;;
  short)
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
    PYTHONPATH=/tmp/site:$PWD timeout 120 python benchmarks/kernels/benchmark_gemv.py --dtypes bf16 \
      --shapes qkv mla_q_kv_a dense_down --m 1 --csv $OUT/short.csv 2>&1 | grep "M=\|speed-up\|   1 " ;;
esac
