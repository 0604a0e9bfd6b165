"""`OutputProcessor` on hand-made step results (no model, no tokenizer): how the sampler's logprob
rows become `Logprob`s."""

import dataclasses

from vllm.outputs import CompletionOutput, RequestOutput
from vllm.sampling_params import SamplingParams
from vllm.v1.engine.output_processor import OutputProcessor
from vllm.v1.request import Request, RequestStatus

NEG_INF = float("-inf")


def _processor_with_one_request(params: SamplingParams) -> OutputProcessor:
    processor = OutputProcessor(tokenizer=None)
    seq = Request("r#0", [1, 2, 3], params, None, 4, 0)
    processor.add_request("r", None, [1, 2, 3], params, [seq], discard_output=False)
    return processor


def test_tied_logprobs_share_the_best_rank_in_the_top_k_too():
    """The sampler ranks a token 1 + the number of strictly more likely tokens (ties share the
    best rank); the top-k columns must follow the same policy, not their column order."""
    processor = _processor_with_one_request(SamplingParams(logprobs=5, prompt_logprobs=5))
    # Column 0: the sampled / prompt token (with the sampler's rank), then the top 5, best first.
    ids = [7, 3, 5, 7, 9, 4]
    values = [-1.0, -1.0, -1.0, -1.0, -2.0, -2.0]
    sampled_rank = 1
    expected = {3: 1, 5: 1, 7: 1, 9: 4, 4: 4}
    outputs, _ = processor.process(
        {"r#0": [7]},
        {"r#0": (ids, values, sampled_rank)},
        {"r#0": [(ids, values, sampled_rank), ([9, 0, 8, 9], [NEG_INF] * 4, 1)]},
        [],
    )
    (out,) = outputs
    (position,) = out.outputs[0].logprobs
    assert {t: lp.rank for t, lp in position.items()} == expected
    first, second, third = out.prompt_logprobs
    assert first is None
    assert {t: lp.rank for t, lp in second.items()} == expected
    # Every token tied (at -inf): all share rank 1, as the sampler ranks the target itself.
    assert {t: lp.rank for t, lp in third.items()} == {9: 1, 0: 1, 8: 1}


class _CountingTokenizer:
    """Decodes byte ids and counts its decodes."""

    def __init__(self) -> None:
        self.decodes = 0

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        self.decodes += 1
        return bytes(ids).decode("utf-8", errors="replace")


def test_detokenize_false_decodes_nothing_of_the_request():
    """As upstream: token ids only, an empty text and logprobs without their tokens' text; and
    no decode at all, which is the time such a caller asks to save."""
    tokenizer = _CountingTokenizer()
    processor = OutputProcessor(tokenizer)
    outputs = {}
    for detokenize in (True, False):
        params = SamplingParams(logprobs=1, prompt_logprobs=1, detokenize=detokenize)
        request_id = f"r{detokenize}"
        seq = Request(f"{request_id}#0", [72, 105, 33], params, None, 4, 0)
        processor.add_request(request_id, None, [72, 105, 33], params, [seq], False)
        tokenizer.decodes = 0
        seq.append_output_token_id(104)
        (out,), _ = processor.process(
            {seq.request_id: [104]},
            {seq.request_id: ([104, 105], [-0.5, -1.0], 1)},
            {seq.request_id: [([105, 104], [-0.1, -2.0], 1), ([33, 104], [-0.2, -3.0], 1)]},
            [],
        )
        outputs[detokenize] = (out, tokenizer.decodes)
    (decoded, decoded_count), (raw, raw_count) = outputs[True], outputs[False]
    assert decoded.outputs[0].text == "h" and decoded_count > 0
    assert decoded.outputs[0].logprobs[0][105].decoded_token == "i"
    assert raw_count == 0
    assert raw.outputs[0].text == "" and raw.outputs[0].token_ids == [104]
    for position in [*raw.outputs[0].logprobs, *raw.prompt_logprobs[1:]]:
        assert all(lp.decoded_token is None for lp in position.values())


def _one_token_output() -> RequestOutput:
    """The output of a request whose one token (7) ended it at its `max_tokens`."""
    processor = _processor_with_one_request(SamplingParams(max_tokens=1))
    seq = processor.requests["r"].completions[0].request
    seq.append_output_token_id(7)
    seq.status = RequestStatus.FINISHED_LENGTH_CAPPED
    (out,), _ = processor.process({"r#0": [7]}, {}, {}, [seq])
    assert out.finished and out.outputs[0].token_ids == [7]
    return out


def test_request_outputs_carry_upstreams_fields_with_this_engines_values():
    """Upstream scripts read `metrics`, `num_cached_tokens` and the rest of upstream's
    `RequestOutput`: each is there, with what it holds for a request of this engine (no prefix
    cache: 0 cached tokens; no per-request timestamps: no metrics, as upstream's `LLM` gives by
    default), in upstream's order after `finished`."""
    out = _one_token_output()
    assert out.metrics is None
    assert out.num_cached_tokens == 0
    assert out.lora_request is None and out.kv_transfer_params is None
    assert out.encoder_prompt is None and out.encoder_prompt_token_ids is None
    names = [f.name for f in dataclasses.fields(RequestOutput)]
    assert names[names.index("finished") + 1 :] == [
        "metrics", "lora_request", "encoder_prompt", "encoder_prompt_token_ids",
        "num_cached_tokens",
    ]  # fmt: skip


def test_completion_outputs_carry_upstreams_fields_with_this_engines_values():
    """Upstream's `CompletionOutput` has `routed_experts` between `logprobs` and `finish_reason`,
    and `lora_request` and `kv_transfer_params` last: each is there, None for a completion of
    this engine (no routing is recorded, no LoRA, no KV connector), in upstream's order, so that
    upstream code that builds one with positional arguments fills the same fields here."""
    (completion,) = _one_token_output().outputs
    assert completion.finish_reason == "length" and completion.stop_reason is None
    assert completion.routed_experts is None
    assert completion.lora_request is None and completion.kv_transfer_params is None
    assert [f.name for f in dataclasses.fields(CompletionOutput)] == [
        "index", "text", "token_ids", "cumulative_logprob", "logprobs", "routed_experts",
        "finish_reason", "stop_reason", "lora_request", "kv_transfer_params",
    ]  # fmt: skip
