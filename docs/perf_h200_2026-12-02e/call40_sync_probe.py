"""Probe: host syncs during one 8k prefill step of the 48B dummy model (device call 40)."""

import collections
import sys
import time
import traceback
import warnings

import torch

from vllm import SamplingParams
from vllm.engine.arg_utils import EngineArgs
from vllm.v1.engine.llm_engine import LLMEngine

PTPC = '{"linear":"fp8_per_channel","ignore":["re:(?!.*self_attn\\\\.o_proj$).*"]}'
MODEL = sys.argv[1] if len(sys.argv) > 1 else "kimi-linear-48b-a3b"
N = int(sys.argv[2]) if len(sys.argv) > 2 else 8192
ea = EngineArgs(
    model=MODEL,
    load_format="dummy",
    skip_tokenizer_init=True,
    quantization_config=PTPC,
    max_num_seqs=4,
    max_model_len=N + 64,
    max_num_batched_tokens=N,
    enforce_eager=True,
    kv_cache_memory=8 * 2**30,
)
engine = LLMEngine.from_engine_args(ea)
sp = SamplingParams(max_tokens=1, temperature=0.0)


def prefill(tag, n=N):
    engine.add_request(tag, list(range(100, 100 + n)), sp)
    while engine.has_unfinished_requests():
        engine.step()


t = time.perf_counter()
prefill("warm")
print(f"warm-up prefill {time.perf_counter() - t:.1f} s", flush=True)
sites = collections.Counter()


def record(message, category, filename, lineno, file=None, line=None):
    frames = [
        f for f in traceback.extract_stack()[:-1] if "/vllm/" in f.filename or "/fla/" in f.filename
    ]
    key = " <- ".join(f"{f.filename.split('/')[-1]}:{f.lineno}:{f.name}" for f in frames[::-1][:6])
    sites[(str(message)[:60], key)] += 1


warnings.showwarning = record
warnings.simplefilter("always")
torch.cuda.is_available() and torch.cuda.synchronize()
torch.cuda.is_available() and torch.cuda.set_sync_debug_mode("warn")
t = time.perf_counter()
prefill("probe")
torch.cuda.is_available() and torch.cuda.set_sync_debug_mode(0)
torch.cuda.is_available() and torch.cuda.synchronize()
print(f"probed prefill {time.perf_counter() - t:.3f} s; {sum(sites.values())} syncs", flush=True)
for (msg, key), n in sites.most_common():
    print(f"{n:4d}  {msg}\n      {key}")
engine.shutdown()
