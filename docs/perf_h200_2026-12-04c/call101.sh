#!/usr/bin/env bash
# Device call 101: the routed experts' tail tiles (GPU tests, kernel benchmark), the 8k prefill with
# and without them in the engine (with the routed rows per expert), fla-core's chunk_kda by kernel.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl .devrun/xd/*.whl
export PYTHONPATH=/tmp/site:$PWD
D=docs/perf_h200_2026-12-04c
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
timeout 100 python -m pytest -q -m gpu -n 4 -p no:cacheprovider tests/model_executor/test_fused_moe.py -k tail > $OUT/c101_tests.log 2>&1
echo "tests rc $?"; tail -4 $OUT/c101_tests.log
C=128,64,8,4/128,64,8,3/tma
timeout 110 python benchmarks/kernels/benchmark_moe.py --paths tgrouped --tokens 8192 4096 --fused-shared-experts 1 \
  --timing flushed --tgrouped-configs 128/$C 128+16/$C 128+32/$C 128+64/$C > $OUT/c101_moe.log 2>&1
echo "moe rc $?"; grep -E "copy_|T=" $OUT/c101_moe.log
C=128,64,4,4/128,64,4,4/tma
timeout 50 python benchmarks/kernels/benchmark_moe.py --paths tgrouped --tokens 2048 --fused-shared-experts 1 \
  --timing flushed --tgrouped-configs 64/$C 64+16/$C 64+32/$C > $OUT/c101_moe64.log 2>&1
echo "moe64 rc $?"; grep -E "T=" $OUT/c101_moe64.log
BEST=$(python3 - <<'PY'
import os, re
best = {}
for line in open(os.environ["OUT"] + "/c101_moe.log"):
    m = re.search(r"T=8192 tgrouped\[128(?:\+(\d+))?/\S+\] \(flushed\)\s+([\d.]+) us", line)
    if m:
        best[int(m.group(1) or 0)] = float(m.group(2))
tails = {t: us for t, us in best.items() if t}
print(min(tails, key=tails.get) if tails else 32)
PY
)
echo "tail for the engine: $BEST"
P='{"linear":"fp8_per_channel","ignore":["re:(?!.*self_attn\\.o_proj$).*"]}'
for T in 0 $BEST; do
  timeout 170 python $D/prefill_tail.py $T $OUT/c101_hist_$T.json --model kimi-linear-48b-a3b --load-format dummy \
    --skip-tokenizer-init --quantization-config "$P" --batch-sizes 1 --input-lens 8192 --output-len 2 \
    --warmup-steps 1 --profile-prefill --max-num-batched-tokens 8192 --output-json $OUT/c101_prefill_$T.json \
    > $OUT/c101_prefill_$T.log 2>&1
  echo "engine tail $T rc $?"; grep -E "copy_|matmul|routed rows|prefill \(|routed experts|KDA|MLA prefill|dense|device busy|largest|^  [0-9]" $OUT/c101_prefill_$T.log | head -20
done
timeout 60 python $D/fla_chunk_kda_profile.py > $OUT/c101_fla.log 2>&1; echo "fla rc $?"; head -20 $OUT/c101_fla.log
