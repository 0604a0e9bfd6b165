#!/usr/bin/env bash
# Fifty-third run's device calls (carry [".whl", ".devrun"]). One PART per call, or several:
#   PART="suite profile" runs both in order.
#   suite   the whole GPU test suite on this tree (`pytest -m gpu -n 4 $TESTS`, TESTS default
#           tests, LIMIT seconds, default 420);
#   rerun   the files of call 218's two failures and the router's, one process (no -n), in TREE, with the test files in EXTRA
#           (default this tree; .devrun/cur: `git archive <commit> vllm tests benchmarks pyproject.toml`);
#   gc      gc_capture.py: does a garbage collection inside a capture break it (one process a case);
#   engine  decode at 1k and 8k (BATCHES, default 1), trees alternating (RUNS picks them): new (this tree),
#           prev (.devrun/prev: fa7da33, before the static weights' early loads) and nofuse
#           (.devrun/nofuse: fa6db8c, before the fused KDA input norm), sig (.devrun/sig: branch
#           pdl-signal-first, each kernel signals the next before its PDL wait), mla (.devrun/mla:
#           branch mla-early-tile, the MLA split's first cache tile read before its PDL wait,
#           archived with tests and pyproject.toml too), mlapf (.devrun/mlapf: branch
#           mla-early-prefetch, the same tile asked of L2 before the wait instead); each tree is
#           `git archive <commit> vllm benchmarks` without `vllm/models/kimi_k3/trained`;
#   profile batch-1 decode at 8k by kernel group, this tree (LIMIT seconds, default 300).
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
    --quantization-config "$P" --batch-sizes ${BATCHES:-1} --input-lens 1024 8192 --output-len 32 \
    --warmup-steps 4 --max-num-batched-tokens 8192 > $OUT/engine_$label.log 2>&1
   echo "$label rc $?"; grep "decode (graph)\|engine start" $OUT/engine_$label.log | cut -c1-150)
}
for part in ${PART:-suite}; do
  case $part in
    suite)
      PYTHONPATH=/tmp/site:$PWD timeout ${LIMIT:-420} python -m pytest -q -m gpu -n 4 --durations=30 \
        -p no:cacheprovider ${TESTS:-tests} > $OUT/gpu_suite${SUFFIX:-}.log 2>&1
      echo "gpu suite rc $?"; grep -E "passed|failed|FAILED|Error" $OUT/gpu_suite${SUFFIX:-}.log | tail -15 ;;
    rerun)
      (cd ${TREE:-.} && PYTHONPATH=/tmp/site:$PWD timeout ${LIMIT:-300} python -m pytest -q -m gpu \
        -p no:cacheprovider tests/models/kimi_k3/test_amd_kda_prefill_graphs.py \
        tests/models/kimi_k3/test_amd_mla.py tests/model_executor/layers/fused_moe/test_fused_router.py \
        ${EXTRA:-} \
        > $OUT/gpu_rerun.log 2>&1)
      echo "gpu rerun rc $?"; grep -E "passed|failed|FAILED|Error" $OUT/gpu_rerun.log | tail -15 ;;
    gc)
      for kind in none tensor event graph graph_pool; do
        timeout 60 python docs/perf_h200_2026-12-07c/gc_capture.py $kind 2>&1 | tail -1 | cut -c1-200
      done ;;
    engine)
      for label in ${RUNS:-new1 nofuse1 new2 nofuse2}; do
        case $label in
          new*) engine_run $label $PWD ;;
          prev*) engine_run $label $PWD/.devrun/prev ;;
          nofuse*) engine_run $label $PWD/.devrun/nofuse ;;
          sig*) engine_run $label $PWD/.devrun/sig ;;
          mlapf*) engine_run $label $PWD/.devrun/mlapf ;;
          mla*) engine_run $label $PWD/.devrun/mla ;;
        esac
      done ;;
    profile)
      PYTHONPATH=/tmp/site:$PWD TQDM_DISABLE=1 timeout ${LIMIT:-300} python \
        benchmarks/benchmark_latency.py --model $MODEL --load-format dummy --skip-tokenizer-init \
        --quantization-config "$P" --batch-sizes 1 --input-lens 8192 --output-len 8 \
        --warmup-steps 2 --max-num-batched-tokens 8192 --profile-steps 3 > $OUT/profile.log 2>&1
      echo "profile rc $?"; grep -v "^INFO\|USDT" $OUT/profile.log | grep -A22 "B=1: device time" \
        | cut -c1-150 ;;
  esac
done
