"""Probe: host time of eager prefill steps (1k and 8k) of the 48B dummy model, by function."""

import cProfile
import io
import pstats
import time

import torch

from vllm import SamplingParams
from vllm.engine.arg_utils import EngineArgs
from vllm.v1.engine.llm_engine import LLMEngine

PTPC = '{"linear":"fp8_per_channel","ignore":["re:(?!.*self_attn\\\\.o_proj$).*"]}'
ea = EngineArgs(
    model="kimi-linear-48b-a3b",
    load_format="dummy",
    skip_tokenizer_init=True,
    quantization_config=PTPC,
    max_num_seqs=4,
    max_model_len=8300,
    max_num_batched_tokens=8192,
    enforce_eager=True,
    kv_cache_memory=8 * 2**30,
)
engine = LLMEngine.from_engine_args(ea)
sp = SamplingParams(max_tokens=1, temperature=0.0)
count = 0


def prefill(n):
    global count
    count += 1
    engine.add_request(f"r{count}", list(range(100 + count, 100 + count + n)), sp)
    while engine.has_unfinished_requests():
        engine.step()
    torch.cuda.synchronize()


for n in (1024, 8192, 1024, 8192):
    t = time.perf_counter()
    prefill(n)
    print(f"warm {n}: {time.perf_counter() - t:.3f} s", flush=True)
for n in (1024, 8192):
    times = []
    for _ in range(3):
        t = time.perf_counter()
        prefill(n)
        times.append(time.perf_counter() - t)
    print(f"prefill {n}: " + " ".join(f"{x * 1e3:.1f}" for x in times) + " ms", flush=True)
    prof = cProfile.Profile()
    prof.enable()
    prefill(n)
    prof.disable()
    for key in ("tottime", "cumulative"):
        s = io.StringIO()
        pstats.Stats(prof, stream=s).sort_stats(key).print_stats(45)
        print(f"==== {n} by {key}\n" + s.getvalue(), flush=True)
engine.shutdown()
