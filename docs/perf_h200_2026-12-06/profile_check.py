"""Device-call check (fortieth run): the runner's cache sizing with the KDA prefill graphs
captured, where the step limit (`max_num_batched_tokens` 512) is one of their buckets, so the
profiling forward would replay a graph unless replays are off while it runs (thirty-ninth run's
review fix). kimi-k3-tiny with the PTPC recipe, `gpu_memory_utilization` set (the profiling path),
greedy tokens of 6 prompts of 40-700 tokens; run once with VLLM_KDA_PREFILL_GRAPHS=1 and once
with 0. The logs give the memory lines and the capture; the script prints a digest of the tokens.

    VLLM_KDA_PREFILL_GRAPHS=1 python profile_check.py
"""

import hashlib
import os
import random

from vllm import LLM, SamplingParams

PTPC = {"linear": "fp8_per_channel", "ignore": ["re:(?!.*self_attn\\.o_proj$).*"]}


def main() -> None:
    llm = LLM("kimi-k3-tiny", quantization_config=PTPC, max_num_batched_tokens=512,
              max_num_seqs=8, max_model_len=1024, gpu_memory_utilization=0.3)  # fmt: skip
    gen = random.Random(0)
    prompts = [[gen.randrange(1, 300) for _ in range(n)] for n in (40, 130, 300, 511, 512, 700)]
    params = SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True)
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params)
    tokens = [list(o.outputs[0].token_ids) for o in outs]
    flag = os.environ.get("VLLM_KDA_PREFILL_GRAPHS", "(unset)")
    digest = hashlib.sha256(repr(tokens).encode()).hexdigest()[:16]
    print(f"VLLM_KDA_PREFILL_GRAPHS={flag}: tokens {digest}; first {tokens[0][:8]}")


if __name__ == "__main__":
    main()
