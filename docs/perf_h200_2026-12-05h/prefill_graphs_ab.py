"""Device-call probe (thirty-ninth run): one prompt's prefill with the KDA prefill core from CUDA
graphs (`VLLM_KDA_PREFILL_GRAPHS=1`, kda_prefill_graphs.py) or eager (`=0`), whichever the
environment says: the engine on the given model with dummy weights and the PTPC recipe, then, per
prompt length, `--reps` prompts one after another (prefill and one sampled token each, host time
included), the median and spread of their seconds, after one unmeasured prompt of that length.

    VLLM_KDA_PREFILL_GRAPHS=1 python prefill_graphs_ab.py --model kimi-linear-48b-a3b
"""

import argparse
import os
import random
import statistics
import time

import torch

from vllm.engine.arg_utils import EngineArgs
from vllm.sampling_params import SamplingParams
from vllm.v1.engine.llm_engine import LLMEngine

PTPC = {"linear": "fp8_per_channel", "ignore": ["re:(?!.*self_attn\\.o_proj$).*"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model", default="kimi-linear-48b-a3b")
    parser.add_argument("--lengths", type=int, nargs="+", default=[256, 1024, 2048, 8192])
    parser.add_argument("--reps", type=int, default=8)
    args = parser.parse_args()
    start = time.perf_counter()
    engine = LLMEngine.from_engine_args(
        EngineArgs(model=args.model, load_format="dummy", skip_tokenizer_init=True,
                   quantization_config=PTPC, max_num_seqs=8, max_num_batched_tokens=8192,
                   max_model_len=9000)
    )  # fmt: skip
    flag = os.environ.get("VLLM_KDA_PREFILL_GRAPHS", "(unset)")
    print(f"VLLM_KDA_PREFILL_GRAPHS={flag}: engine ready in {time.perf_counter() - start:.1f} s")
    gen = random.Random(0)
    params = SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True)
    try:
        for length in args.lengths:
            seconds = []
            for rep in range(args.reps + 1):
                prompt = [gen.randrange(1, 150000) for _ in range(length)]
                torch.cuda.synchronize()
                t0 = time.perf_counter()
                engine.add_request(f"{length}-{rep}", prompt, params)
                while engine.has_unfinished_requests():
                    engine.step()
                torch.cuda.synchronize()
                if rep:  # the first of each length is a warm-up
                    seconds.append(time.perf_counter() - t0)
            ms = sorted(1000 * s for s in seconds)
            print(
                f"VLLM_KDA_PREFILL_GRAPHS={flag} length {length}: median "
                f"{statistics.median(ms):.1f} ms, min {ms[0]:.1f}, max {ms[-1]:.1f} "
                f"({len(ms)} prompts)",
                flush=True,
            )
    finally:
        engine.shutdown()


if __name__ == "__main__":
    main()
