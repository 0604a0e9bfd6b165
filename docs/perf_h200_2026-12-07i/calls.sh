#!/usr/bin/env bash
# Fifty-ninth run's device calls (carry [".whl", ".devrun"]). One PART per call, or several:
#   PART="engine suite" runs both in order.
#   suite     the GPU tests on this tree (`pytest -m gpu -n 4 $TESTS`, TESTS default tests, LIMIT
#             seconds, default 420), log gpu_suite$SUFFIX.log;
#   kdasweep  benchmark_kda_decode.py's variant sweep with the gate projections in the kernel (the
#             engine's call there) for SHAPES (default kimi-linear) at SWEEP_BATCHES (default
#             "1 2 4"), log and csv named after the shape;
#   engine    decode at 1k and 8k for BATCHES (default 1), trees alternating (RUNS, default
#             "new_1 v32w4_1 new_2 v32w4_2", each label a tree and a run number): new (this tree)
#             or .devrun/<tree>, `git archive HEAD vllm benchmarks` with `kda_decode_config`'s
#             V-split below two programs per SM (16-column blocks, 4 warps on main) changed to the
#             tree's name: v32w4, v64w8;
#   grid      the grid (batch 1, 8, 64, 256 at 1k and 8k; an H200 runs the 256-expert
#             model: needs_h200), log and json grid.log / grid.json;
#   profile   decode at 8k by kernel group for BATCHES (default "1 2 4"), this tree (LIMIT seconds,
#             default 420).
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
    kdasweep)
      for shape in ${SHAPES:-kimi-linear}; do
        PYTHONPATH=/tmp/site:$PWD timeout 240 python benchmarks/kernels/benchmark_kda_decode.py \
          --sweep-gate-proj --shapes $shape --quantize --batches ${SWEEP_BATCHES:-1 2 4} \
          --no-compare --variants v16w4 v16w8 v32w4 v32w8 v64w4 v64w8 v16w2 \
          --csv $OUT/kda_sweep_$shape.csv > $OUT/kda_sweep_$shape.log 2>&1
        echo "kdasweep $shape rc $?"; cut -c1-400 $OUT/kda_sweep_$shape.log
      done ;;
    engine)
      for label in ${RUNS:-new_1 v32w4_1 new_2 v32w4_2}; do
        tree=${label%_*}
        if [ "$tree" = new ]; then engine_run $label $PWD; else engine_run $label $PWD/.devrun/$tree; fi
      done ;;
    grid)
      PYTHONPATH=/tmp/site:$PWD TQDM_DISABLE=1 timeout ${LIMIT:-560} python \
        benchmarks/benchmark_latency.py --model $MODEL --load-format dummy --skip-tokenizer-init \
        --quantization-config "$P" --batch-sizes 1 8 64 256 --input-lens 1024 8192 \
        --output-len 16 --warmup-steps 2 --max-num-batched-tokens 8192 --time-budget-s 400 \
        --output-json $OUT/grid.json > $OUT/grid.log 2>&1
      echo "grid rc $?"; grep -v "^INFO\|USDT" $OUT/grid.log | tail -30 | cut -c1-200 ;;
    profile)
      PYTHONPATH=/tmp/site:$PWD TQDM_DISABLE=1 timeout ${LIMIT:-420} python \
        benchmarks/benchmark_latency.py --model $MODEL --load-format dummy --skip-tokenizer-init \
        --quantization-config "$P" --batch-sizes ${BATCHES:-1 2 4} --input-lens 8192 --output-len 8 \
        --warmup-steps 2 --max-num-batched-tokens 8192 --profile-steps 3 > $OUT/profile.log 2>&1
      echo "profile rc $?"; grep -v "^INFO\|USDT" $OUT/profile.log | grep -A12 "device time\|decode (graph)" \
        | cut -c1-150 ;;
  esac
done
