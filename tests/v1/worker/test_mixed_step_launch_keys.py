"""On the CPU, which steps of an eager engine would compile a Triton kernel again on an H100: every
kernel that prefill steps and mixed steps (decodes and prompt chunks together) launch, keyed as
Triton keys it (tests/launch_keys.py).

On the H100 (Triton 3.6, Kimi-Linear, 8k prompts, 8192 batched tokens, eager) each of the first
three mixed steps compiled the prefill conv kernels again, 0.5-1.5 s each, although warm-up and
earlier steps had compiled them: the KDA layer hands the conv the metadata of the prefill rows as
slices after the decode rows, whose 16-byte alignment changes with the decode count, and the token
and sequence counts as ints, which Triton specializes on being 1 or a multiple of 16.

Here one new prompt a step, of varied lengths and chunked at 64 tokens, makes steps of 1 to 11
decodes with one to three prompt chunks. After warm-up (the steps before the first decode:
prefills, as the engine's profiling forward) a kernel may compile again only for a launch of its
own: other constexprs or options (its launch heuristics' choice for the batch) or argument types.
A key that differs from an earlier one of the same launch only in Triton's specialization of an
argument is a compile that gains nothing, unless the argument is listed in `ALLOWED`. The decode
kernels, whose keys follow the batch class by design, are test_decode_launch_keys.py's.
"""

import pytest
from launch_keys import launch_of, native_specialize_impl, record_launch_keys, varying

from vllm.engine.arg_utils import EngineArgs
from vllm.sampling_params import SamplingParams
from vllm.v1.engine.llm_engine import LLMEngine

DECODE = {
    "_fused_kda_decode_kernel", "_kda_decode_epilogue_kernel",
    "_mla_decode_split_kernel", "_mla_decode_merge_kernel",
}  # fmt: skip
CONV = ("_causal_conv1d_prefill_kernel", "_conv_state_update_kernel")
# The kernels whose keys once changed in these steps, per model: the recorder must see them, or
# a path that no longer reaches a kernel on the CPU (a layer's device branch) passes unchecked.
# Both models' experts run the Triton grouped path (SiLU, and Kimi-K3's SiTU since the kernels
# fuse it), without the row gather of torch's grouped GEMM.
RECORDED = {*CONV, "_mla_prefill_operands_kernel", "_per_token_fp8_quant_kernel"}
RECORDED_BY_MODEL = {
    "kimi-k3-tiny": RECORDED | {"_moe_grouped_gate_up_kernel"},
    "kimi-linear-tiny": RECORDED | {"_moe_grouped_gate_up_kernel"},
}
# Arguments whose specialization may change between launches, and why.
ALLOWED = {
    # The conv's input: the projection's rows after the decode rows, loaded in vectors. It is
    # 16-byte aligned at every decode count where a row is a multiple of 16 bytes (Kimi-Linear's
    # 25152 at TP 1), not in the tiny models (rows of 12568 and 1800 bytes).
    "_causal_conv1d_prefill_kernel": {"x_ptr"},
    "_conv_state_update_kernel": {"x_ptr"},
    # The GEMV's rows also size its split-K partials (`split * M * N`), whose loads and stores
    # vectorize on that product's divisibility: a key at most for M equal to 1, a multiple of
    # 16, or neither.
    "_gemv_kernel": {"M"},
    "_gemv_split_reduce_kernel": {"M"},
    # The routed rows bound the contiguous loads of the expert ids, which each program makes
    # twice, in vectors where their count's divisibility allows.
    "_moe_group_rows_kernel": {"num_rows"},
}
# One new prompt a step: the chunks take many lengths, 1 to 3 a step, and 48 prefill tokens in
# step 16 make a token count a multiple of 16.
LENGTHS = [40, 31, 44, 25, 28, 26, 14, 31, 7, 76, 64, 61, 88, 35, 29, 59, 48, 9, 15, 13]


@pytest.mark.skipif(native_specialize_impl is None, reason="needs Triton's CUDA specialization")
@pytest.mark.parametrize("model", ["kimi-k3-tiny", "kimi-linear-tiny"])
def test_mixed_steps_compile_no_kernel_again_for_its_arguments_alone(
    monkeypatch, torch_reference_kernels, model
):
    log, phase = [], [None]
    ptpc = {"linear": "fp8_per_channel", "ignore": ["re:(?!.*self_attn\\.o_proj$).*"]}
    eng = LLMEngine.from_engine_args(
        EngineArgs(
            model=model, quantization_config=ptpc, enforce_eager=True, dtype="bfloat16",
            max_num_seqs=24, max_num_batched_tokens=64, kv_cache_memory=1 << 28,
            max_model_len=4096, async_scheduling=False,
        )
    )  # fmt: skip
    schedules = []  # per step: its decodes, its prompt chunks' lengths
    try:
        runner = eng.executor.runner
        record_launch_keys(monkeypatch, runner.model, log, phase)
        execute = runner.execute

        def scheduled(step):
            decodes = step.batch.num_decodes
            schedules.append((decodes, step.batch.num_new[decodes:]))
            return execute(step)

        monkeypatch.setattr(runner, "execute", scheduled)
        params = SamplingParams(temperature=0.0, max_tokens=64, ignore_eos=True)
        for step, length in enumerate(LENGTHS):
            eng.add_request(str(step), [1 + step] * length, params)
            phase[0] = step
            eng.step()
    finally:
        eng.shutdown()
    assert len(schedules) == len(LENGTHS)
    warm_up = next(i for i, (decodes, _) in enumerate(schedules) if decodes)
    mixed = [(decodes, chunks) for decodes, chunks in schedules if decodes and chunks]
    assert set(range(1, 12)) <= {decodes for decodes, _ in mixed}, schedules
    assert {len(chunks) for _, chunks in mixed} == {1, 2, 3}, schedules
    assert len({n for _, chunks in mixed for n in chunks}) >= 20, schedules
    assert any(sum(chunks) % 16 == 0 for _, chunks in mixed), schedules

    seen: dict[str, set] = {}
    again = []  # (step, kernel, the arguments whose specialization made its key new)
    for step, name, key in log:
        keys = seen.setdefault(name, set())
        if step >= warm_up and name not in DECODE and key not in keys:
            same = [k for k in keys if launch_of(k) == launch_of(key)]
            if same and not any(varying([k, key]) <= ALLOWED.get(name, set()) for k in same):
                again.append((step, name, sorted(set.union(*(varying([k, key]) for k in same)))))
        keys.add(key)
    assert RECORDED_BY_MODEL[model] <= seen.keys(), sorted(seen)
    assert not again, again
    for name in CONV:
        # One key, or two where the tiny models' input rows are unaligned after odd decodes.
        assert len(seen[name]) <= 2 and varying(seen[name]) <= {"x_ptr"}, (name, seen[name])
