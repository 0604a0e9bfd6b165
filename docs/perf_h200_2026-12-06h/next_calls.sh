#!/usr/bin/env bash
# Forty-eighth run's device calls (carry [".whl", ".devrun"]). One PART per call:
#   grid   (~9 min, an H200: needs_h200) the issue's grid on this tree
#          (docs/perf_h200_2026-12-06c/next_calls.sh's `grid`);
#   after  (~4 min, on the same machine) the GEMV experts' defaults on the H200 (ran on an H100
#          instead: call 190)
#          (docs/perf_h200_2026-12-06g/next_calls.sh's `gemv`), then the MLA prefill GPU tests:
#          1ad907b copies only v where q is contiguous (Kimi-K3's q; the 8192-token case of
#          test_gpu_same_bits_as_cat_and_pad passes its q that way);
#   alloc  (~1 min) alloc_probe.py: a second `make_moe` in one process read slower in call 190;
#          placement, or time? (call 191: the first ~50 ms of replays after it, a transient);
#   verify (~1 min) kernel_bench's warm-up replays against that transient: its GPU test, and
#          alloc_probe.py at the two cases that showed it;
#   h200   (~3 min, an H200) the GEMV experts' defaults and TRITON_MAX_ROWS there;
#   qkv    (~2 min, any GPU) the Triton GEMV with the experts' tiles at the large input
#          projections, against cuBLAS (below);
#   profile (~4 min, on the same machine) one 8k prompt, its prefill and 3 batch-1 decode steps
#          under the profiler: the kernel groups against their floors with this tree's kernels.
set -u
case "${PART:-after}" in
  grid) PART=grid bash docs/perf_h200_2026-12-06g/next_calls.sh ;;
  after)
    PART=gemv bash docs/perf_h200_2026-12-06g/next_calls.sh
    [ -n "${TESTS:-1}" ] || exit 0
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .devrun/xd/*.whl
    PYTHONPATH=/tmp/site:$PWD timeout 240 python -m pytest -q -m gpu -p no:cacheprovider \
      tests/models/kimi_k3/test_amd_mla_prefill.py > $OUT/mla_prefill_gpu.log 2>&1
    echo "mla prefill tests rc $?"; tail -3 $OUT/mla_prefill_gpu.log ;;
  verify)
    # After call 191: the warm-up replays of kernel_bench._capture, by its GPU test and by the
    # probe's two cases that showed the transient.
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl .devrun/xd/*.whl
    PYTHONPATH=/tmp/site:$PWD timeout 120 python -m pytest -q -m gpu -p no:cacheprovider \
      tests/benchmarks/test_kernel_bench_timing.py 2>&1 | tail -2
    CASES="kimi-k3-tp8 2,kimi-linear 1" PART=alloc bash $0 ;;
  alloc)
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
    IFS=, read -ra cases <<< "${CASES:-kimi-k3-tp8 2,kimi-k3-tp8 4,kimi-linear 1,kimi-linear 4}"
    for case in "${cases[@]}"; do
      PYTHONPATH=/tmp/site:$PWD timeout 90 python docs/perf_h200_2026-12-06h/alloc_probe.py $case 2>&1 | grep "T="
    done ;;
  h200)
    # The GEMV experts' defaults and TRITON_MAX_ROWS on the GPU the issue is about (calls 190-193
    # ran on H100s), now with kernel_bench's warm-up replays: the forty-sixth run's `gemv` part
    # as call 190 ran it (its Kimi-K3 orders should now agree).
    PART=gemv bash docs/perf_h200_2026-12-06g/next_calls.sh ;;
  qkv)
    # Call 191's batch-1 profile (H100): cuBLAS's M = 8 tiles read the 27 large input
    # projections (KDA's fused q/k/v and gates 2304 -> 12448, MLA's q | kv_a 2304 -> 6720) at
    # about 85% of copy (527 us a step against ~450), where the routed experts' GEMV-style
    # kernels read 89-95%. The Triton GEMV at those shapes with the experts' tile shapes
    # (8 channels, 256- or 512-wide steps, one stage) against cuBLAS, one row and two.
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
    PYTHONPATH=/tmp/site:$PWD timeout 300 python benchmarks/kernels/benchmark_gemv.py --dtypes bf16 \
      --shapes qkv mla_q_kv_a --m 1 2 --configs default 8,256,4,1,1 8,512,4,1,1 8,256,4,1,3 \
      16,256,8,1,1 4,256,4,1,1 8,256,4,a,1 --csv $OUT/qkv.csv 2>&1 | tail -30 ;;
  profile)
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
    P='{"linear":"fp8_per_channel","ignore":["re:(?!.*self_attn\\.o_proj$).*"]}'
    MODEL=kimi-linear-48b-a3b
    if [ "$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1)" -lt 100000 ]; then
      # An H100: the 48B config with 128 of its 256 experts (as calls 145-166).
      mkdir -p /tmp/k128 && python3 -c "
import json; c = json.load(open('vllm/models/kimi_k3/config_only/kimi-linear-48b-a3b/config.json'))
c['num_experts'] = 128; json.dump(c, open('/tmp/k128/config.json', 'w'))"
      MODEL=/tmp/k128
    fi
    PYTHONPATH=/tmp/site:$PWD TQDM_DISABLE=1 timeout ${LIMIT:-540} python benchmarks/benchmark_latency.py \
      --model $MODEL --load-format dummy --skip-tokenizer-init --quantization-config "$P" \
      --batch-sizes 1 --input-lens 8192 --output-len 8 --warmup-steps 2 \
      --max-num-batched-tokens 8192 --profile-steps 3 --profile-prefill > $OUT/profile.log 2>&1
    echo "profile rc $?"; grep -v "^INFO\|USDT" $OUT/profile.log | grep -B2 -A16 "kernel group" | cut -c1-150
    grep -v "^INFO\|USDT" $OUT/profile.log | tail -14 ;;
esac
