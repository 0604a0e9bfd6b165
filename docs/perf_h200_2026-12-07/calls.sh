#!/usr/bin/env bash
# Fifty-first run's device calls (carry [".whl", ".devrun"]). One PART per call, or several:
#   PART="tests engine" runs both in order.
#   tests   (~2 min, any GPU) the GEMV's and the fused input norm's GPU tests, with the static
#           weights' first tiles loaded before the PDL wait (gemv.py, "Static weights"): bit
#           for bit the plain launches, and graphs whose rows a PDL kernel writes just before;
#   engine  (~4 min, an H200, or an H100 with 128 of the experts) batch-1 decode at 1k and 8k,
#           trees alternating: new (this one: the GEMVs' and the router's early loads), gemv
#           (.devrun/gemv: `git archive 6051793 vllm benchmarks`, the GEMVs' early loads only),
#           sel (.devrun/sel: cf7a974 with the bf16 linears and the fused KDA projection
#           launched plain, as landed after call 206),
#           prev (.devrun/prev: fa7da33, the fused input norm without early loads) and nofuse
#           (.devrun/nofuse: fa6db8c, before the fused input norm); RUNS picks them;
#   profile (~3 min) batch-1 decode at 8k by kernel group, this tree;
#   static  (~1 min) benchmark_gemv_static_weight.py: o_proj, MLA's q | kv_a and the KDA
#           projection right after the short launches before them, static against plain;
#   bench   (~1 min) benchmark_rms_norm_gemv.py (call 198's first form, now B40 + early loads);
#   sweep   (~1 min) MLA's q | kv_a at one row in narrower K steps (as the fiftieth run's);
#   ab      (~3 min, .devrun/old: `git archive b528cce vllm benchmarks`) the grouped experts at
#           8 / 64 / 256 tokens, call 148's tree against this one, old / new / old / new.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .whl/*.whl
P='{"linear":"fp8_per_channel","ignore":["re:(?!.*self_attn\\.o_proj$).*"]}'
MODEL=kimi-linear-48b-a3b
if [ "$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1)" -lt 100000 ]; then
  # An H100: the 48B config with 128 of its 256 experts (as call 191).
  mkdir -p /tmp/k128 && python3 -c "
import json; c = json.load(open('vllm/models/kimi_k3/config_only/kimi-linear-48b-a3b/config.json'))
c['num_experts'] = 128; json.dump(c, open('/tmp/k128/config.json', 'w'))"
  MODEL=/tmp/k128
fi
AB=$PWD/docs/perf_h200_2026-12-06i/ab_latency.py
engine_run() {
  label=$1; tree=$2
  (cd $tree && PYTHONPATH=/tmp/site:$tree VLLM_KDA_PREFILL_GRAPHS=0 TQDM_DISABLE=1 \
    timeout 300 python $AB --model $MODEL --load-format dummy --skip-tokenizer-init \
    --quantization-config "$P" --batch-sizes 1 --input-lens 1024 8192 --output-len 32 \
    --warmup-steps 4 --max-num-batched-tokens 8192 > $OUT/engine_$label.log 2>&1
   echo "$label rc $?"; grep "decode (graph)\|engine start" $OUT/engine_$label.log | cut -c1-150)
}
for part in ${PART:-tests}; do
  case $part in
    tests)
      PYTHONPATH=/tmp/site:$PWD timeout 240 python -m pytest -q -m gpu -p no:cacheprovider \
        tests/kernels/linear/test_gemv.py tests/kernels/linear/test_rms_norm_gemv.py \
        > $OUT/gpu_tests.log 2>&1
      echo "gpu tests rc $?"; grep -E "passed|failed|Error" $OUT/gpu_tests.log | tail -5 ;;
    engine)
      for label in ${RUNS:-new1 prev1 gemv1 nofuse1 new2 prev2 gemv2 nofuse2}; do
        case $label in
          new*) engine_run $label $PWD ;;
          gemv*) engine_run $label $PWD/.devrun/gemv ;;
          sel*) engine_run $label $PWD/.devrun/sel ;;
          prev*) engine_run $label $PWD/.devrun/prev ;;
          nofuse*) engine_run $label $PWD/.devrun/nofuse ;;
        esac
      done ;;
    profile)
      PYTHONPATH=/tmp/site:$PWD TQDM_DISABLE=1 timeout ${LIMIT:-300} python \
        benchmarks/benchmark_latency.py --model $MODEL --load-format dummy --skip-tokenizer-init \
        --quantization-config "$P" --batch-sizes 1 --input-lens 8192 --output-len 8 \
        --warmup-steps 2 --max-num-batched-tokens 8192 --profile-steps 3 > $OUT/profile.log 2>&1
      echo "profile rc $?"; grep -v "^INFO\|USDT" $OUT/profile.log | grep -A22 "B=1: device time" \
        | cut -c1-150 ;;
    static)
      (cd benchmarks/kernels && PYTHONPATH=/tmp/site:$PWD/../.. timeout 150 python \
        benchmark_gemv_static_weight.py --csv $OUT/static_weight.csv > $OUT/static.log 2>&1)
      echo "static rc $?"; cut -c1-130 $OUT/static.log ;;
    bench)
      (cd benchmarks/kernels && PYTHONPATH=/tmp/site:$PWD/../.. timeout 150 python \
        benchmark_rms_norm_gemv.py --csv $OUT/rms_norm_gemv.csv > $OUT/bench.log 2>&1)
      echo "bench rc $?"; cut -c1-120 $OUT/bench.log ;;
    sweep)
      (cd benchmarks/kernels && PYTHONPATH=/tmp/site:$PWD/../.. timeout 200 python \
        benchmark_gemv.py --dtypes bf16 --shapes mla_q_kv_a --m 1 --configs default \
        2,2048,4,1,1 2,1024,4,1,1 4,1024,4,1,1 4,512,4,1,1 8,256,4,1,1 \
        --csv $OUT/sweep.csv > $OUT/sweep.log 2>&1)
      echo "sweep rc $?"; grep "M=  1\|speed-up" $OUT/sweep.log | cut -c1-100 ;;
    ab)
      # b528cce's benchmark_moe.py has no --shape (Kimi-Linear's was its only shape).
      for label in old new old new; do
        tree=$PWD; shape="--shape kimi-linear"
        [ $label = old ] && tree=$PWD/.devrun/old && shape=""
        (cd $tree/benchmarks/kernels && PYTHONPATH=/tmp/site:$tree timeout 100 python \
          benchmark_moe.py $shape --fused-shared-experts 1 --paths tgrouped \
          --tokens 8 64 256 2>&1 | grep "T=" | cut -c1-100 | sed "s|^|$label: |")
      done ;;
  esac
done
