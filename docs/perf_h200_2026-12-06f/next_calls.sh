#!/usr/bin/env bash
# Prepared in the forty-fifth run for the next device session (carry [".whl", ".devrun"]). One
# PART per call:
#   gpu   (~3 min, any GPU) call181.sh: the MLA prefill GPU tests on c679e50 (the second
#         reading's changes around the operands kernel), the operands at 8192 tokens, the GEMV
#         tiles at Kimi-K3's two-token expert shapes (76.8% of copy in call 177);
#   grid  (~9 min, an H200: needs_h200) the grid, last on an H200 in call 148; now with
#         the MLA operands in one launch and the 256-wide down tiles (both measured as kernels
#         on an H100 only), and everything since call 148;
#   ab8k  (~6 min, after grid on the same machine, or alone: an H100 takes 128 of the experts)
#         one 8k prompt's prefill (prefill_graphs_ab.py, 5 prompts after one unmeasured) on
#         this tree and on a copy with the forty-fifth run's two kernel changes reverted
#         (ab45.patch), one process each, alternating twice: their effect in the engine.
set -u
case "${PART:-gpu}" in
  gpu) bash docs/perf_h200_2026-12-06f/call181.sh ;;
  grid) PART=grid bash docs/perf_h200_2026-12-06d/next_calls.sh ;;
  ab8k)
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
    M=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1)
    nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
    MODEL=kimi-linear-48b-a3b
    if [ "$M" -lt 100000 ]; then
      mkdir -p /tmp/k128 && python3 -c "
import json; c = json.load(open('vllm/models/kimi_k3/config_only/kimi-linear-48b-a3b/config.json'))
c['num_experts'] = 128; json.dump(c, open('/tmp/k128/config.json', 'w'))"
      MODEL=/tmp/k128
    fi
    NEW=$PWD BASE=/tmp/base
    rm -rf $BASE && cp -a . $BASE && (cd $BASE && patch -s -R -p1 < docs/perf_h200_2026-12-06f/ab45.patch)
    for run in new base new2 base2; do
      case $run in new*) TREE=$NEW ;; *) TREE=$BASE ;; esac
      (cd $TREE && PYTHONPATH=/tmp/site:$TREE timeout ${LIMIT:-200} python \
        docs/perf_h200_2026-12-05h/prefill_graphs_ab.py --model $MODEL --lengths 8192 --reps 5 \
        > $OUT/ab8k_$run.log 2>&1; echo "$run rc $?")
      grep -h "engine ready\|8192\|Error" $OUT/ab8k_$run.log | cut -c1-200 | tail -4
    done ;;
esac
