#!/usr/bin/env bash
# Thirty-first run's device calls, one PART per call; carry [".whl", ".devrun"].
#   host  (~5 min)  the conftest rule for GPU hosts without the serving dependencies (collection
#                   only), then host_profile.py: steady-state mixed steps of 256 prompts of 1k and
#                   of 8k timed, device busy against wall, and the host's time by function;
#                   then the same on the tree before the KDA mixed-step change (its diff and
#                   rm_gate.patch, the removal of the gate kernel it left unused, reversed).
#                   The KDA layer's GPU tests on the change run first, after the collection.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl .devrun/xd/*.whl
export PYTHONPATH=/tmp/site:$PWD
P='{"linear":"fp8_per_channel","ignore":["re:(?!.*self_attn\\.o_proj$).*"]}'
D=docs/perf_h200_2026-12-05b
case "${PART:-host}" in
  host)
    timeout 60 python -m pytest --collect-only -q -m gpu -p no:cacheprovider tests > $OUT/collect.log 2>&1
    echo "collect rc $?"; tail -4 $OUT/collect.log
    timeout 150 python -m pytest -q -m gpu -p no:cacheprovider tests/models/kimi_k3/test_amd_kda.py \
      tests/models/kimi_k3/test_amd_kda_oproj_ptpc.py > $OUT/kda_tests.log 2>&1
    echo "kda tests rc $?"; tail -5 $OUT/kda_tests.log
    timeout 240 python $D/host_profile.py --model kimi-linear-48b-a3b --load-format dummy \
      --skip-tokenizer-init --quantization-config "$P" --batch-sizes 256 --input-lens 1024 8192 \
      --output-len 64 --warmup-steps 1 --max-num-batched-tokens 8192 > $OUT/host.log 2>&1
    echo "host rc $?"; grep -v "^INFO\|USDT" $OUT/host.log | grep -v "^ *[0-9/]* *0.000 *0.000" | head -120
    git apply -R $D/rm_gate.patch && git apply -R $D/kda_mixed.patch || exit 1
    WARM=6 TIMED=6 PROFILED=0 timeout 130 python $D/host_profile.py --model kimi-linear-48b-a3b \
      --load-format dummy --skip-tokenizer-init --quantization-config "$P" --batch-sizes 256 \
      --input-lens 1024 8192 --output-len 64 --warmup-steps 1 --max-num-batched-tokens 8192 \
      > $OUT/host_base.log 2>&1
    echo "base rc $?"; grep "a step\|step (\|profiler step\|idle\|prefill (single" $OUT/host_base.log
    git apply $D/kda_mixed.patch && git apply $D/rm_gate.patch || exit 1 ;;
esac
