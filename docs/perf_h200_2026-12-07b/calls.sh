#!/usr/bin/env bash
# Fifty-second run's device calls (carry [".whl", ".devrun"]). One PART per call, or several:
#   PART="engine tests" runs both in order.
#   engine  batch-1 decode at 1k and 8k, trees alternating (RUNS picks them): new (this tree),
#           l2 (.devrun/l2: `git archive shared-l2-prefetch vllm benchmarks tests pyproject.toml`,
#           the router's L2 prefetch of the fused shared expert's gate / up rows), prev
#           (.devrun/prev: fa7da33, before the static weights' early loads) and nofuse
#           (.devrun/nofuse: fa6db8c, before the fused KDA input norm), sf (.devrun/sf: branch
#           moe-shared-first, the same archive: the fused shared slot's gate/up programs first,
#           their rows prefetched into L2 before the PDL wait);
#   tests   the GEMV's and the fused input norm's GPU tests on this tree;
#   l2tests the branch's router and L2-prefetch GPU tests (in .devrun/l2);
#   sftests the shared-first branch's GPU tests (in .devrun/sf): the MoE and router files;
#   moe     benchmark_moe.py --shared-expert at 1 and 8 tokens, MOE_RUNS (default new sf new sf);
#   profile batch-1 decode at 8k by kernel group, this tree (LIMIT seconds, default 300);
#   static  benchmark_gemv_static_weight.py (fifty-first run's).
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
          l2*) engine_run $label $PWD/.devrun/l2 ;;
          sf*) engine_run $label $PWD/.devrun/sf ;;
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
    l2tests)
      (cd .devrun/l2 && PYTHONPATH=/tmp/site:$PWD timeout 240 python -m pytest -q -m gpu \
        -p no:cacheprovider tests/model_executor/layers/fused_moe/test_fused_router.py \
        tests/triton_utils/test_l2_prefetch.py > $OUT/l2_tests.log 2>&1)
      echo "l2 tests rc $?"; grep -E "passed|failed|Error" $OUT/l2_tests.log | tail -5 ;;
    sftests)
      (cd .devrun/sf && PYTHONPATH=/tmp/site:$PWD timeout 300 python -m pytest -q -m gpu \
        -p no:cacheprovider tests/model_executor/test_fused_moe.py \
        tests/model_executor/layers/fused_moe/test_fused_router.py > $OUT/sf_tests.log 2>&1)
      echo "sf tests rc $?"; grep -E "passed|failed|Error" $OUT/sf_tests.log | tail -5 ;;
    moe)
      for label in ${MOE_RUNS:-new sf new sf}; do
        tree=$PWD; [ $label != new ] && tree=$PWD/.devrun/$label
        (cd $tree/benchmarks/kernels && PYTHONPATH=/tmp/site:$tree timeout 120 python \
          benchmark_moe.py --shared-expert --tokens 1 8 2>&1 | grep -v "^INFO" | cut -c1-110 \
          | sed "s|^|$label: |")
      done ;;
  esac
done
