#!/usr/bin/env bash
# Fiftieth run's device calls (carry [".whl", ".devrun"]). One PART per call, or several:
#   PART="tests bench" runs both in order.
#   tests  (~2 min, any GPU) the GEMV's GPU tests (the one-row dispatch, the wide tile) and the
#          input norm in the one-row GEMV's launch (rms_norm_gemv.py: bit for bit the two
#          launches it replaces at Kimi-Linear's KDA input projection, CUDA-graph replay);
#   bench  (~1 min, any GPU) benchmark_rms_norm_gemv.py: fused against norm then GEMV;
#   engine (~7 min, an H200, or an H100 with 128 of the experts) batch-1 decode at 1k and 8k,
#          three trees alternating: new (this one), prev (.devrun/prev: `git archive e9331b2
#          vllm benchmarks`, the one-row GEMV without the fused norm) and base (.devrun/base:
#          `git archive d30d019 vllm benchmarks`, before the one-row GEMV); RUNS picks them,
#          and var* runs this tree with rms_norm_gemv.py's form $VAR (below);
#   profile (~3 min) batch-1 decode at 8k by kernel group, this tree;
#   sweep  (~1 min, an H200) MLA's q | kv_a at one row in narrower K steps;
#   ab     (~3 min, any GPU; .devrun/old: `git archive b528cce vllm benchmarks`) the grouped
#          experts at 8 / 64 / 256 tokens, call 148's tree against this one, old / new / old / new.
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
    bench)
      (cd benchmarks/kernels && PYTHONPATH=/tmp/site:$PWD/../.. timeout 150 python \
        benchmark_rms_norm_gemv.py --csv $OUT/rms_norm_gemv.csv > $OUT/bench.log 2>&1)
      echo "bench rc $?"; cat $OUT/bench.log | cut -c1-120 ;;
    engine)
      for label in ${RUNS:-new1 prev1 base1 new2 prev2 base2}; do
        case $label in
          new*) engine_run $label $PWD ;;
          var*)
            # This tree with rms_norm_gemv.py's form $VAR (as `variants`).
            rm -rf /tmp/vtree && mkdir -p /tmp/vtree && cp -r vllm benchmarks /tmp/vtree/
            [ $VAR = B ] || patch -s -p1 -d /tmp/vtree < docs/perf_h200_2026-12-06j/forms/$VAR.patch
            engine_run $label /tmp/vtree ;;
          prev*) engine_run $label $PWD/.devrun/prev ;;
          base*) engine_run $label $PWD/.devrun/base ;;
        esac
      done ;;
    profile)
      PYTHONPATH=/tmp/site:$PWD TQDM_DISABLE=1 timeout ${LIMIT:-300} python \
        benchmarks/benchmark_latency.py --model $MODEL --load-format dummy --skip-tokenizer-init \
        --quantization-config "$P" --batch-sizes 1 --input-lens 8192 --output-len 8 \
        --warmup-steps 2 --max-num-batched-tokens 8192 --profile-steps 3 > $OUT/profile.log 2>&1
      echo "profile rc $?"; grep -v "^INFO\|USDT" $OUT/profile.log | grep -A22 "B=1: device time" \
        | cut -c1-150 ;;
    variants)
      # rms_norm_gemv.py's kernel in four forms (forms/*.patch apply to bcbed74's
      # form B): A the loop as `_gemv_kernel`'s (32 registers on sm_90), B the first weight
      # tile loaded before the norm's sum (48), B40 that under maxnreg 40, C every next tile
      # loaded a step ahead (47; call 198: 19.47 us against 16.81 for the two launches).
      # B40 landed (1f56bfa): run this part on a checkout of bcbed74, where B is the tree's.
      for v in ${VARIANTS:-A B B40 C A B}; do
        rm -rf /tmp/tree && mkdir -p /tmp/tree && cp -r vllm benchmarks /tmp/tree/
        [ $v = B ] || patch -s -p1 -d /tmp/tree < docs/perf_h200_2026-12-06j/forms/$v.patch
        (cd /tmp/tree/benchmarks/kernels && PYTHONPATH=/tmp/site:/tmp/tree timeout 100 python \
          benchmark_rms_norm_gemv.py --paths fused unfused > $OUT/var_$v.log 2>&1
         echo "$v rc $?"; grep "fused\|differ" $OUT/var_$v.log | cut -c1-100)
      done ;;
    sweep)
      # MLA's q | kv_a at one row: the default tile (2 channels x 4096, K 2304 masked, 80
      # registers, 4.24 waves) against narrower K steps that waste no lanes (performance.md,
      # "Waves of the batch-1 decode launches").
      (cd benchmarks/kernels && PYTHONPATH=/tmp/site:$PWD/../.. timeout 200 python \
        benchmark_gemv.py --dtypes bf16 --shapes mla_q_kv_a --m 1 --configs default \
        2,2048,4,1,1 2,1024,4,1,1 4,1024,4,1,1 4,512,4,1,1 8,256,4,1,1 \
        --csv $OUT/sweep.csv > $OUT/sweep.log 2>&1)
      echo "sweep rc $?"; grep "M=  1\|speed-up" $OUT/sweep.log | cut -c1-100 ;;
    ab)
      for label in old new old new; do
        tree=$PWD; [ $label = old ] && tree=$PWD/.devrun/old
        (cd $tree/benchmarks/kernels && PYTHONPATH=/tmp/site:$tree timeout 100 python \
          benchmark_moe.py --shape kimi-linear --fused-shared-experts 1 --paths tgrouped \
          --tokens 8 64 256 2>&1 | grep "T=" | cut -c1-100 | sed "s|^|$label: |")
      done ;;
  esac
done
