"""Tensor parallelism on two GPUs (marked `gpu`, skipped below two): kimi-k3-tiny with the PTPC
recipe and CUDA graphs at TP = 2, NCCL.

- asynchronous scheduling (only rank 0 samples; a step launched ahead reaches rank 1 without
  input ids, which it takes from rank 0's broadcast on the device) gives the tokens of steps run
  one at a time, its steps launched ahead are graph replays, and launching one never waits for
  the device.

The CPU tests cover the same path over gloo (tests/v1/executor/test_multiproc_executor.py); this
one runs it where the collectives are NCCL's and the decode steps are graphs.
"""

import pytest
import torch
from steps_ahead import greedy_steps_ahead

from vllm.engine.arg_utils import EngineArgs
from vllm.v1.engine.llm_engine import LLMEngine

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs"),
]

PTPC = {"linear": "fp8_per_channel", "ignore": ["re:(?!.*self_attn\\.o_proj$).*"]}


def run(
    async_scheduling: bool, monkeypatch: pytest.MonkeyPatch
) -> tuple[dict[str, list[int]], int]:
    eng = LLMEngine.from_engine_args(
        EngineArgs(
            model="kimi-k3-tiny", quantization_config=PTPC, tensor_parallel_size=2,
            max_num_seqs=8, max_num_batched_tokens=256, kv_cache_memory=1 << 30,
            max_model_len=256, async_scheduling=async_scheduling,
        )
    )  # fmt: skip
    try:
        assert eng.executor.runner.graphs
        return greedy_steps_ahead(eng, monkeypatch)
    finally:
        eng.shutdown()


def test_tp2_steps_launched_ahead_get_rank0s_ids_and_keep_the_tokens(monkeypatch):
    launched_ahead, ahead = run(True, monkeypatch)
    one_at_a_time, none = run(False, monkeypatch)
    assert ahead == 18 and none == 0  # every decode step but the first and the last
    assert all(len(tokens) == 20 for tokens in one_at_a_time.values())
    assert launched_ahead == one_at_a_time
