"""`ModelRunner.warm_up_mixed_steps` on the CPU: after it, mixed steps launch no decode kernel
with a Triton key it did not launch (so on a GPU they compile none), and it changes no real
request's cache or tokens.

The keys are recorded as an H100 would key them (tests/launch_keys.py). The graphs' capture warms
up the decode-only form of the decode kernels; a mixed step runs its decode rows in another form
(the KDA decode without its norm epilogue), whose first launch in each batch class compiled inside
that step (docs/performance.md, "Mixed steps with graphs").
"""

import random

import pytest
import torch
from launch_keys import native_specialize_impl, record_launch_keys

from vllm.config.vllm import cudagraph_capture_sizes, decode_batch_class
from vllm.engine.arg_utils import EngineArgs
from vllm.sampling_params import SamplingParams
from vllm.v1.engine.llm_engine import LLMEngine

DECODE = (
    "_fused_kda_decode_kernel", "_kda_decode_epilogue_kernel",
    "_mla_decode_split_kernel", "_mla_decode_merge_kernel",
)  # fmt: skip
PTPC = {"linear": "fp8_per_channel", "ignore": ["re:(?!.*self_attn\\.o_proj$).*"]}
MAX_NUM_SEQS = 24
SIZES = cudagraph_capture_sizes(MAX_NUM_SEQS, None)  # 1, 2, 4, 8, 16, 24


def engine(model: str) -> LLMEngine:
    return LLMEngine.from_engine_args(
        EngineArgs(
            model=model, quantization_config=PTPC, enforce_eager=True, dtype="bfloat16",
            max_num_seqs=MAX_NUM_SEQS, max_num_batched_tokens=256, kv_cache_memory=1 << 28,
            max_model_len=4096, async_scheduling=False,
        )
    )  # fmt: skip


@pytest.mark.skipif(native_specialize_impl is None, reason="needs Triton's CUDA specialization")
@pytest.mark.parametrize("model", ["kimi-k3-tiny", "kimi-linear-tiny"])
def test_mixed_steps_launch_only_decode_keys_the_warm_up_launched(
    monkeypatch, capsys, startup_bars, torch_reference_kernels, model
):
    log, phase = [], ["warm-up"]
    eng = engine(model)
    schedules = []  # per step: (decodes, prompt chunks)
    try:
        runner = eng.executor.runner
        record_launch_keys(monkeypatch, runner.model, log, phase)
        runner.warm_up_mixed_steps(SIZES)
        assert "Warming up mixed steps: 100%" in capsys.readouterr().err
        execute = runner.execute

        def scheduled(step):
            decodes = step.batch.num_decodes
            schedules.append((decodes, len(step.batch.num_new) - decodes))
            return execute(step)

        monkeypatch.setattr(runner, "execute", scheduled)
        params = SamplingParams(temperature=0.0, max_tokens=64, ignore_eos=True)
        # One new prompt a step: 0, 1, ..., 17 sequences decoding beside it, every class of
        # 1..24 but the largest.
        for step in range(18):
            eng.add_request(str(step), [1 + step] * 9, params)
            phase[0] = step
            eng.step()
    finally:
        eng.shutdown()
    assert schedules == [(step, 1) for step in range(18)]
    warmed = {(name, key) for where, name, key in log if where == "warm-up"}
    stepped = [(where, name, key) for where, name, key in log if where != "warm-up"]
    assert set(DECODE) <= {name for _, name, _ in stepped}
    assert {decode_batch_class(n) for n, _ in schedules if n} == {1, 2, 4, 8, 16, 24}
    # (step, kernel) of each launch that would compile a decode kernel in a step on the GPU.
    new = {(where, name) for where, name, key in stepped if (name, key) not in warmed}
    compiled = sorted((where, name) for where, name in new if name in DECODE)
    assert not compiled, compiled


def caches(model: torch.nn.Module) -> list[torch.Tensor]:
    """Every KDA state pool's and MLA cache's tensor, slot or block first."""
    out = []
    for module in model.modules():
        pool = getattr(module, "state_pool", None)
        if pool is not None:
            out += [pool.conv_state, pool.ssm_state]
        cache = getattr(module, "kv_cache", None)
        if cache is not None:
            out.append(cache)
    return out


def test_warm_up_between_steps_writes_only_the_dummies(torch_reference_kernels):
    """A warm-up between two steps of live requests changes only slot 0 and block 0 of the
    caches, and the requests' greedy tokens and logprobs are those of a run without it."""
    gen = random.Random(0)
    prompts = [[gen.randrange(1, 200) for _ in range(gen.randint(3, 30))] for _ in range(8)]
    params = SamplingParams(temperature=0.0, max_tokens=10, ignore_eos=True, logprobs=2)

    def run(warm_up_at: int | None) -> dict[str, list]:
        eng = engine("kimi-k3-tiny")
        out = {}
        try:
            runner = eng.executor.runner
            step = 0
            while step < len(prompts) or eng.has_unfinished_requests():
                if step < len(prompts):
                    eng.add_request(str(step), prompts[step], params)
                if step == warm_up_at:
                    before = [t.clone() for t in caches(runner.model)]
                    runner.warm_up_mixed_steps(SIZES)
                    pairs = list(zip(before, caches(runner.model), strict=True))
                    assert pairs
                    assert all(torch.equal(old[1:], new[1:]) for old, new in pairs)
                    assert not all(torch.equal(old[0], new[0]) for old, new in pairs)
                for o in eng.step():
                    if o.finished:
                        c = o.outputs[0]
                        out[o.request_id] = (c.token_ids, c.logprobs)
                step += 1
        finally:
            eng.shutdown()
        return out

    assert run(warm_up_at=5) == run(warm_up_at=None)
