"""On the CPU, the premise of test_cuda_graphs.py's GPU test of mixed steps: the decode rows of a
mixed step, run eagerly at their own count, launch the MLA decode kernels with the Triton keys
that the graphs' capture compiled, and the KDA decode kernels with at most one new key per batch
class.

No kernel runs: the four kernels are replaced by recorders of Triton's cache key (constexprs,
launch options and Triton's own specialization of every other argument for the CUDA backend:
dtypes, 16-byte pointer alignment, ints equal to 1 or divisible by 16, i32 / i64), with an H100's
launch heuristics (132 SMs, sm_90 shared memory, PDL), and the ops return their torch references.
So the check covers what the config tests (test_amd_mla_decode.py, test_amd_fused_kda_decode.py)
cannot: the strides, alignments and ints that the model passes on each path.
"""

import pytest
import torch

import vllm.models.kimi_k3.amd.kda as kda_layer
import vllm.models.kimi_k3.amd.ops.fused_kda_decode as kda_op
import vllm.models.kimi_k3.amd.ops.mla_decode as mla_op
import vllm.models.kimi_k3.amd.ops.mla_decode_config as mla_config
from vllm.config.vllm import cudagraph_capture_sizes, decode_batch_class
from vllm.engine.arg_utils import EngineArgs
from vllm.sampling_params import SamplingParams
from vllm.v1.engine.llm_engine import LLMEngine
from vllm.v1.worker.model_runner import BatchSchedule

try:
    # Imported by the specialization on first use; now, while the kernels' Triton mode (the
    # interpreter, conftest.py) is the environment's, as its import asserts.
    import triton.experimental.gluon  # noqa: F401
    from triton.backends.nvidia.compiler import CUDABackend
    from triton.runtime.jit import JITFunction, native_specialize_impl
except ImportError:  # a Triton without the CUDA backend or its native specialization
    CUDABackend = JITFunction = native_specialize_impl = None

MLA = ("_mla_decode_split_kernel", "_mla_decode_merge_kernel")
KDA = ("_fused_kda_decode_kernel", "_kda_decode_epilogue_kernel")


class _KeyRecorder:
    """Stands in for a Triton kernel: each launch appends (phase, name, key) to `log`."""

    def __init__(self, name, kernel, log, phase):
        self.name, self.log, self.phase = name, log, phase
        # The parameters as Triton's JIT sees them (the kernel may be the interpreter's).
        self.params = JITFunction(kernel.fn, **getattr(kernel, "kwargs", {})).params

    def __getitem__(self, grid):
        def record(*args, **kwargs):
            params = self.params
            names = [p.name for p in params]
            # Positional arguments first, the constexprs and launch options by keyword.
            values = dict(zip(names, args, strict=False)) | kwargs
            options = tuple(sorted((k, v) for k, v in kwargs.items() if k not in names))
            key = [options]
            for p in params:
                v = values.get(p.name, p.default)
                if p.is_constexpr:
                    key.append((p.name, repr(v)))
                else:
                    spec = native_specialize_impl(
                        CUDABackend, v, p.is_const, not p.do_not_specialize,
                        not p.do_not_specialize_on_alignment,
                    )  # fmt: skip
                    key.append((p.name, repr(spec)))
            self.log.append((self.phase[0], self.name, tuple(key)))

        return record


def _install(monkeypatch, log, phase):
    for module, names in ((mla_op, MLA), (kda_op, KDA)):
        for name in names:
            monkeypatch.setattr(module, name, _KeyRecorder(name, getattr(module, name), log, phase))
    for module in (mla_op, kda_op, kda_layer):
        monkeypatch.setattr(module, "num_sms", lambda device=None: 132)
    for module in (mla_op, kda_op):
        monkeypatch.setattr(module, "use_pdl", lambda device: True)
    monkeypatch.setattr(mla_op, "max_shared_memory", lambda device: 232448)
    monkeypatch.setattr(kda_op, "use_triton_fp8", lambda device, dtype: True)
    monkeypatch.setattr(mla_op, "use_triton", lambda device: True)
    launch = mla_op.launch_mla_decode

    def mla_launch(q_latent, q_pe, kv_cache, block_tables, seq_lens, scale, config, counters=None):
        launch(q_latent, q_pe, kv_cache, block_tables, seq_lens, scale, config, counters)
        return mla_op.mla_decode_paged_ref(q_latent, q_pe, kv_cache, block_tables, seq_lens, scale)

    monkeypatch.setattr(mla_op, "launch_mla_decode", mla_launch)
    kernels = {"on": False}
    monkeypatch.setattr(kda_op, "use_triton", lambda device: kernels["on"])
    decode = kda_layer.fused_kda_decode

    def kda_decode(*args, **kwargs):
        kernels["on"] = True  # the launches, recorded
        try:
            decode(*args, **kwargs)
        finally:
            kernels["on"] = False
        return decode(*args, **kwargs)  # the reference, for the step's output and state

    monkeypatch.setattr(kda_layer, "fused_kda_decode", kda_decode)


@pytest.mark.skipif(native_specialize_impl is None, reason="needs Triton's CUDA specialization")
def test_mixed_steps_decode_rows_launch_the_captured_decode_keys(
    monkeypatch, torch_reference_kernels
):
    log, phase = [], ["capture"]
    _install(monkeypatch, log, phase)
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
    assert {name for _, name, _ in launched} == set(MLA + KDA)
    # The steps that would compile an MLA decode kernel on the GPU.
    new = [(where, name) for where, name, key in launched if (name, key) not in captured]
    mla_new = [(where, name) for where, name in new if name in MLA]
    assert not mla_new, mla_new
    classes = len({decode_batch_class(n) for n in decoding if n})
    for name in KDA:
        keys = {key for _, kernel, key in launched if kernel == name}
        assert len(keys - {key for kernel, key in captured if kernel == name}) <= classes, name
