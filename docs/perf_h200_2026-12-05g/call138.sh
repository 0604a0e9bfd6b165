#!/usr/bin/env bash
# Thirty-seventh run, call 138 (carry [".whl", ".devrun"]): the whole GPU suite on this tree (last
# run whole in call 109), then the quantization audit's CUDA-side changes on a real sm_90: the
# tiny model under the PTPC recipe with each FP8 linear kernel forced (VLLM_FP8_LINEAR_KERNEL),
# greedy tokens against the unforced run, and the warnings the engine logs.
set -u
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl .devrun/xd/*.whl
export PYTHONPATH=/tmp/site:$PWD
timeout ${LIMIT:-420} python -m pytest -q -m gpu -n 4 -p no:cacheprovider --durations=15 tests \
  > $OUT/gpu_tests.log 2>&1
echo "gpu rc $?"; tail -30 $OUT/gpu_tests.log
for K in "" RowWiseTorchFP8ScaledMMLinearKernel ChannelWiseTorchFP8ScaledMMLinearKernel; do
  VLLM_FP8_LINEAR_KERNEL=$K timeout 150 python - > $OUT/forced_${K:-none}.log 2>&1 <<'PY'
import logging, os
from vllm import LLM, SamplingParams
records = []
class Keep(logging.Handler):
    def emit(self, r):
        if r.levelno >= logging.WARNING:
            records.append(r.getMessage())
logging.getLogger("vllm").addHandler(Keep())
llm = LLM(model="kimi-k3-tiny", quantization_config='{"linear":"fp8_per_channel","ignore":["re:(?!.*self_attn\\\\.o_proj$).*"]}', skip_tokenizer_init=True)
outs = llm.generate([{"prompt_token_ids": [1, 2, 3, 4, 5, 6, 7]}], SamplingParams(max_tokens=12, temperature=0.0))
print("kernel", os.environ.get("VLLM_FP8_LINEAR_KERNEL") or "(default)")
print("tokens", list(outs[0].outputs[0].token_ids))
print("warnings", len(records), records[:4])
PY
  echo "forced '${K}' rc $?"; grep -v "^INFO" $OUT/forced_${K:-none}.log | tail -6
done
