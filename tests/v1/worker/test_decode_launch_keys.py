"""On the CPU, the premise of test_cuda_graphs.py's GPU test of mixed steps: the decode rows of a
mixed step, run eagerly at their own count, launch the MLA decode kernels with the Triton keys
that the graphs' capture compiled, and the KDA decode kernels with at most one new key per batch
class.

Every kernel is replaced by a recorder of its Triton cache key, with an H100's launch heuristics
(tests/launch_keys.py), and the steps keep the ops' torch references. So the check covers what
the config tests (test_amd_mla_decode.py, test_amd_fused_kda_decode.py) cannot: the strides,
alignments and ints that the model passes on each path.
"""

import pytest
import torch
from launch_keys import native_specialize_impl, record_launch_keys

import vllm.models.kimi_k3.amd.ops.mla_decode_config as mla_config
from vllm.config.vllm import cudagraph_capture_sizes, decode_batch_class
from vllm.engine.arg_utils import EngineArgs
from vllm.sampling_params import SamplingParams
from vllm.v1.engine.llm_engine import LLMEngine
from vllm.v1.worker.model_runner import BatchSchedule

MLA = ("_mla_decode_split_kernel", "_mla_decode_merge_kernel")
KDA = ("_fused_kda_decode_kernel", "_kda_decode_epilogue_kernel")


@pytest.mark.skipif(native_specialize_impl is None, reason="needs Triton's CUDA specialization")
def test_mixed_steps_decode_rows_launch_the_captured_decode_keys(
    monkeypatch, torch_reference_kernels
):
    log, phase = [], ["capture"]
    # As the GPU test: the MLA decode always merges in its second kernel.
    monkeypatch.setattr(mla_config, "_FUSED_MERGE_MAX_BYTES", 0)
    ptpc = {"linear": "fp8_per_channel", "ignore": ["re:(?!.*self_attn\\.o_proj$).*"]}
    eng = LLMEngine.from_engine_args(
        EngineArgs(
            model="kimi-k3-tiny", quantization_config=ptpc, enforce_eager=True, dtype="bfloat16",
            max_num_seqs=24, max_num_batched_tokens=256, kv_cache_memory=1 << 30,
            max_model_len=4096, async_scheduling=False,
        )
    )  # fmt: skip
    rng = torch.get_rng_state()
    try:
        runner = eng.executor.runner
        record_launch_keys(monkeypatch, runner.model, log, phase)
        sizes = cudagraph_capture_sizes(24, None)
        with torch.no_grad():  # ModelRunner.capture_cudagraphs' warm-up, without the graphs
            for size in sorted(sizes, reverse=True):
                metadata = runner.builder.build(BatchSchedule([], [], [], [], 0), pad_to=size)
                runner._logits(runner.input_ids[:size], metadata)
        params = SamplingParams(temperature=0.0, max_tokens=64, ignore_eos=True)
        decoding = []
        for step in range(12):  # one new prompt a step: 0, 1, ..., 11 sequences decoding
            eng.add_request(str(step), [1 + step] * 40, params)
            decoding.append(len(eng.scheduler.running))
            phase[0] = f"step {step}"
            eng.step()
    finally:
        eng.shutdown()
    assert decoding == list(range(12))
    assert torch.equal(torch.get_rng_state(), rng)  # nothing drawn from the global generator
    captured = {(name, key) for where, name, key in log if where == "capture"}
    launched = [(where, name, key) for where, name, key in log if where != "capture"]
    assert set(MLA + KDA) <= {name for _, name, _ in launched}
    # The steps that would compile an MLA decode kernel on the GPU.
    new = [(where, name) for where, name, key in launched if (name, key) not in captured]
    mla_new = [(where, name) for where, name in new if name in MLA]
    assert not mla_new, mla_new
    classes = len({decode_batch_class(n) for n in decoding if n})
    for name in KDA:
        keys = {key for _, kernel, key in launched if kernel == name}
        assert len(keys - {key for kernel, key in captured if kernel == name}) <= classes, name
