#!/usr/bin/env bash
# Forty-fourth run, call 174 (carry [".whl", ".devrun"]): the rewritten
# test_kda_prefill_applies_the_gate_itself on the GPU (against the exact recurrence), then the same
# test with a mutation (fla-core given no lower bound and no safe_gate: the wrong gate), which
# must fail.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl .devrun/xd/*.whl
export PYTHONPATH=/tmp/site:$PWD
T=tests/models/kimi_k3/test_amd_kda.py
timeout 250 python -m pytest -q -m gpu -p no:cacheprovider -rf --tb=line $T -k "applies_the_gate or lower_bound" > $OUT/tests.log 2>&1
echo "tests rc $?"; grep -v "Warn\|warn" $OUT/tests.log | tail -4
sed -i 's/lower_bound=gate.lower_bound, safe_gate=bounded)/lower_bound=None, safe_gate=False)/' vllm/models/kimi_k3/amd/ops/kda_core.py
git diff --stat
timeout 200 python -m pytest -q -m gpu -p no:cacheprovider -rf --tb=line $T -k "applies_the_gate" > $OUT/mutated.log 2>&1
echo "mutated rc $? (must be 1)"; grep -v "Warn\|warn" $OUT/mutated.log | tail -4
git checkout -- vllm/models/kimi_k3/amd/ops/kda_core.py
