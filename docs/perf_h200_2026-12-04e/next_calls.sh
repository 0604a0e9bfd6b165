#!/usr/bin/env bash
# Prepared in the twenty-eighth run for the next device session (not run). One PART per call;
# carry [".whl", ".devrun"]. A fresh machine spends ~120 s compiling in the engine's first
# warm-up: give the first engine run of a call its own generous limit.
#   probe  (~2 min)  what MLA prefill's paths cost on the host and the device, and the first call
#                    per new length (prefill_host_probe.py): why one 8k prompt is 2.6-4.7 ms
#                    slower with cuDNN's per-length-class plans, and whether padding lengths to
#                    multiples of 256 or one nested call per step does better;
#   grid   (~6 min)  the whole grid on this tree (batch 1, 8, 64, 256; 1k and 8k);
#   mixed  (~4 min)  the batch phase's first mixed steps profiled one by one;
#   sync   (~4 min)  every call that makes the host wait for the device in a prefill-only step
#                    and two mixed ones, by call site (sync_points.py; added in the twenty-ninth
#                    run, whose device calls after call 120 were refused).
#   shared (~6 min)  one 8k prefill profiled with the shared expert fused into the routed experts'
#                    grouped kernels (the default) and as its own dense MLP (cuBLAS, ~99% of the
#                    matmul peak at prefill sizes, where the grouped kernels reach ~78% on the
#                    rows they compute): whether prefill-sized steps should run it apart.
#   gpu    (~8 min)  the whole GPU suite (added in the thirtieth run, which had no device): the
#                    thirtieth run's launcher checks (MLA decode, fused KDA decode, the conv's
#                    prefill, gather_rows, moe_weighted_sum, kda_gate_beta), the sampler's own
#                    generator for unseeded rows and the meta-device check at engine start have
#                    run on the CPU only. Run it first, then `grid` (which also exercises them).
# The probe ran in call 120 (twenty-ninth run); gpu, grid, shared, mixed and sync in calls 121-125
# (thirtieth run, docs/perf_h200_2026-12-05/).
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl .devrun/xd/*.whl
export PYTHONPATH=/tmp/site:$PWD
P='{"linear":"fp8_per_channel","ignore":["re:(?!.*self_attn\\.o_proj$).*"]}'
case "${PART:-probe}" in
  probe)
    timeout 300 python docs/perf_h200_2026-12-04e/prefill_host_probe.py > $OUT/probe.log 2>&1
    echo "probe rc $?"; cat $OUT/probe.log ;;
  gpu)
    timeout 560 python -m pytest -q -m gpu -n 4 -p no:cacheprovider --durations=20 tests \
      > $OUT/gpu_tests.log 2>&1
    echo "gpu rc $?"; tail -40 $OUT/gpu_tests.log ;;
  grid)
    timeout 560 python benchmarks/benchmark_latency.py --model kimi-linear-48b-a3b --load-format dummy \
      --skip-tokenizer-init --quantization-config "$P" --batch-sizes 1 8 64 256 --input-lens 1024 8192 \
      --output-len 16 --warmup-steps 2 --max-num-batched-tokens 8192 --time-budget-s 400 \
      --output-json $OUT/grid.json > $OUT/grid.log 2>&1
    echo "grid rc $?"; grep -v "^INFO\|USDT" $OUT/grid.log | tail -30 ;;
  mixed)
    PROFILED=4 timeout 420 python docs/perf_h200_2026-12-04d/mixed_steps.py --model kimi-linear-48b-a3b \
      --load-format dummy --skip-tokenizer-init --quantization-config "$P" --batch-sizes 16 \
      --input-lens 8192 --output-len 2 --warmup-steps 1 --max-num-batched-tokens 8192 \
      > $OUT/mixed.log 2>&1
    echo "mixed rc $?"; grep -v "^INFO\|USDT" $OUT/mixed.log | tail -80 ;;
  shared)
    for F in 1 0; do
      VLLM_KIMI_FUSE_SHARED_EXPERTS=$F timeout 270 python benchmarks/benchmark_latency.py \
        --model kimi-linear-48b-a3b --load-format dummy --skip-tokenizer-init \
        --quantization-config "$P" --batch-sizes 1 --input-lens 8192 --output-len 4 \
        --warmup-steps 1 --profile-prefill --max-num-batched-tokens 8192 \
        > $OUT/shared_$F.log 2>&1
      echo "fused=$F rc $?"; grep -v "^INFO\|USDT" $OUT/shared_$F.log | grep -A14 "prefill" | head -40
    done ;;
  sync)
    STEPS=3 timeout 420 python docs/perf_h200_2026-12-04e/sync_points.py --model kimi-linear-48b-a3b \
      --load-format dummy --skip-tokenizer-init --quantization-config "$P" --batch-sizes 16 \
      --input-lens 8192 --output-len 2 --warmup-steps 1 --max-num-batched-tokens 8192 \
      > $OUT/sync.log 2>&1
    echo "sync rc $?"; grep -v "^INFO\|USDT" $OUT/sync.log | tail -60 ;;
esac
