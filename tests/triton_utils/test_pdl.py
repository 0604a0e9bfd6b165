"""Programmatic dependent launch (vllm/triton_utils/pdl.py): where the kernels take it, and that a
decode step launched with it computes what it computes without.

That every kernel waits before it touches memory, and signals after, is checked in its sm_90 PTX
(tests/triton_utils/test_kernels_compile_for_hopper.py)."""

import pytest
import torch

import vllm.triton_utils.pdl as pdl
from vllm.platforms import current_platform
from vllm.triton_utils.pdl import pdl_options, use_pdl


@pytest.fixture
def fresh(monkeypatch):
    """`use_pdl` re-reads the capability, platform and VLLM_TRITON_PDL."""
    pdl._use_pdl.cache_clear()
    yield monkeypatch
    pdl._use_pdl.cache_clear()


@pytest.mark.parametrize(
    "capability,cuda,env,expected",
    [
        ((9, 0), True, None, True),
        ((10, 0), True, "1", True),
        ((9, 0), True, "0", False),
        ((8, 9), True, None, False),
        ((9, 4), False, None, False),  # ROCm reports itself as a "cuda" device in torch
    ],
)
def test_use_pdl_from_hopper_on_nvidia_unless_switched_off(fresh, capability, cuda, env, expected):
    fresh.setattr(pdl, "_capability", lambda index: capability)
    fresh.setattr(current_platform, "is_cuda", lambda: cuda)
    if env is None:
        fresh.delenv("VLLM_TRITON_PDL", raising=False)
    else:
        fresh.setenv("VLLM_TRITON_PDL", env)
    assert use_pdl(torch.device("cuda", 0)) is expected


def test_no_pdl_on_cpu_even_when_interpreting(fresh):
    fresh.setenv("TRITON_INTERPRET", "1")
    assert not use_pdl(torch.device("cpu"))


def test_pdl_options_pair_the_constexpr_with_the_launch_option():
    assert pdl_options(True) == {"PDL": True, "launch_pdl": True}
    assert pdl_options(False) == {"PDL": False}


@pytest.mark.gpu
def test_gpu_decode_with_pdl_gives_the_same_tokens_and_logprobs(fresh):
    """kimi-k3-tiny with the PTPC recipe, CUDA graphs and a mixed workload (decode steps of many
    sizes, mixed prefill steps): the greedy tokens and their logprobs, bit for bit, with PDL and
    without. A kernel reading an input before the kernel writing it finished would differ."""
    from vllm.engine.arg_utils import EngineArgs
    from vllm.sampling_params import SamplingParams
    from vllm.v1.engine.llm_engine import LLMEngine

    if not use_pdl(torch.device("cuda", torch.cuda.current_device())):
        pytest.skip("needs an NVIDIA GPU from Hopper on")
    ptpc = {"linear": "fp8_per_channel", "ignore": ["re:(?!.*self_attn\\.o_proj$).*"]}
    prompts = [[(7 * i + 3 * j) % 256 for j in range(1 + 5 * i)] for i in range(12)]
    params = SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True, logprobs=0)

    def run() -> dict[str, tuple]:
        eng = LLMEngine.from_engine_args(
            EngineArgs(
                model="kimi-k3-tiny", quantization_config=ptpc, max_num_seqs=16,
                max_num_batched_tokens=128, kv_cache_memory=1 << 30, max_model_len=256,
            )
        )  # fmt: skip
        out, step = {}, 0
        try:
            while len(out) < len(prompts):
                if step < len(prompts):
                    eng.add_request(str(step), prompts[step], params)
                for o in eng.step():
                    if o.finished:
                        c = o.outputs[0]
                        out[o.request_id] = (c.token_ids, repr(c.logprobs))
                step += 1
        finally:
            eng.shutdown()
        return out

    with_pdl = run()
    fresh.setenv("VLLM_TRITON_PDL", "0")
    pdl._use_pdl.cache_clear()
    assert not use_pdl(torch.device("cuda", torch.cuda.current_device()))
    assert run() == with_pdl
