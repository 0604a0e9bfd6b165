"""Sampling and stopping end to end, through `LLM.generate` and `LLMEngine` (kimi-linear-tiny, CPU,
torch reference kernels), against the model itself: one sequence decoded alone
(`model_reference.py`). The sampler's arithmetic is checked row by row in tests/v1/sample and the
detokenizer's stop-string matching in test_detokenizer.py; here, that the engine applies them to
the right request, position and token:

- a seed gives the same tokens whatever else is batched and whenever the request joins; `n`
  completions are seeded seed, seed + 1, ...;
- `logprobs` and `prompt_logprobs` (also over chunked prefill) are the log_softmax of the
  model's logits, with the sampled / prompt token and the top-k, ranks and texts;
- stop strings across token boundaries, stop token ids and eos end the output where they occur,
  kept in or left out of the text as `include_stop_str_in_output` says, with `finish_reason` and
  `stop_reason`; `ignore_eos`; `min_tokens` holds back every kind of stop;
- `repetition_penalty` changes the greedy tokens exactly as its definition says.
"""

import random
from dataclasses import replace

import pytest
import torch
from model_reference import greedy, prompt_logits, reference_decode

from vllm import LLM, SamplingParams
from vllm.outputs import PositionLogprobs, RequestOutput

MODEL = "kimi-linear-tiny"
ARGS = dict(max_model_len=128, max_num_seqs=8, kv_cache_memory=32 << 20)
_gen = random.Random(0)
PROMPTS = [[_gen.randrange(0, 256) for _ in range(n)] for n in (7, 3, 12, 5)]


@pytest.fixture(scope="module")
def llm(torch_reference_kernels):
    llm = LLM(MODEL, **ARGS)
    yield llm
    llm.shutdown()


def generate(llm: LLM, prompts: list, params) -> list[RequestOutput]:
    return llm.generate(prompts, params, use_tqdm=False)


def tokens_of(out: RequestOutput) -> list[int]:
    return list(out.outputs[0].token_ids)


def greedy_tokens(llm: LLM, prompt: list[int], max_tokens: int) -> list[int]:
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    return tokens_of(generate(llm, [prompt], params)[0])


def assert_engine_cache_free(llm: LLM) -> None:
    kv = llm.llm_engine.kv_cache_manager
    assert kv.num_free_blocks == kv.initial_num_free_blocks
    assert kv.num_free_kda_slots == kv.initial_num_free_kda_slots


# -- seeds and n ------------------------------------------------------------------------------


def test_seed_gives_the_same_tokens_whatever_else_is_in_the_batch(llm):
    seeded = SamplingParams(temperature=1.0, seed=1234, max_tokens=8, ignore_eos=True)
    alone = tokens_of(generate(llm, [PROMPTS[0]], seeded)[0])
    others = [
        SamplingParams(temperature=1.0, max_tokens=12, ignore_eos=True),
        SamplingParams(temperature=0.7, top_k=10, seed=99, max_tokens=12, ignore_eos=True),
        SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True),
    ]
    # In one batch, at another row.
    batch = generate(llm, [PROMPTS[1], PROMPTS[2], PROMPTS[0], PROMPTS[3]],
                     [others[0], others[1], seeded, others[2]])  # fmt: skip
    assert tokens_of(batch[2]) == alone
    # Joining a running batch two steps late (other rows' draws came first).
    engine = llm.llm_engine
    for i, params in enumerate(others):
        engine.add_request(f"other{i}", PROMPTS[i + 1], params)
    finals = {}
    for step in range(1000):
        if step == 2:
            engine.add_request("seeded", PROMPTS[0], seeded)
        finals.update({out.request_id: out for out in engine.step() if out.finished})
        if step >= 2 and not engine.has_unfinished_requests():
            break
    assert tokens_of(finals["seeded"]) == alone
    # The seed decides: another one gives other tokens.
    other_seed = SamplingParams(temperature=1.0, seed=1235, max_tokens=8, ignore_eos=True)
    assert tokens_of(generate(llm, [PROMPTS[0]], other_seed)[0]) != alone
    assert_engine_cache_free(llm)


def test_n_completions_are_seeded_one_after_another(llm):
    params = SamplingParams(n=3, temperature=1.0, seed=50, max_tokens=6, ignore_eos=True)
    (out,) = generate(llm, [PROMPTS[0]], params)
    assert [c.index for c in out.outputs] == [0, 1, 2]
    assert all(len(c.token_ids) == 6 and c.finish_reason == "length" for c in out.outputs)
    singles = generate(
        llm, [PROMPTS[0]] * 3,
        [SamplingParams(temperature=1.0, seed=50 + i, max_tokens=6, ignore_eos=True)
         for i in range(3)],
    )  # fmt: skip
    assert [list(c.token_ids) for c in out.outputs] == [tokens_of(s) for s in singles]
    assert len({tuple(c.token_ids) for c in out.outputs}) == 3
    tokenizer = llm.get_tokenizer()
    assert [c.text for c in out.outputs] == [tokenizer.decode(c.token_ids) for c in out.outputs]


# -- logprobs -------------------------------------------------------------------------------------


def check_position(position: PositionLogprobs, token: int, logits: torch.Tensor, k: int,
                   tokenizer) -> None:  # fmt: skip
    """`position` holds `token` and the top `k` of log_softmax(`logits`), with their ranks
    (1 + the number of strictly more likely tokens) and texts."""
    logprobs = torch.log_softmax(logits, dim=-1)
    top = logprobs.topk(k)
    assert set(position) == {token, *top.indices.tolist()}
    for t in {token, *top.indices.tolist()}:
        assert position[t].rank == 1 + int((logprobs > logprobs[t]).sum())
        torch.testing.assert_close(torch.tensor(position[t].logprob), logprobs[t])
        assert position[t].decoded_token == tokenizer.decode([t], skip_special_tokens=False)


def test_logprobs_are_the_models_log_softmax(llm):
    cases = [
        (PROMPTS[0], SamplingParams(temperature=0.0, max_tokens=5, logprobs=3, ignore_eos=True)),
        (PROMPTS[1], SamplingParams(temperature=1.5, seed=3, max_tokens=5, logprobs=2,
                                    ignore_eos=True)),
        (PROMPTS[2], SamplingParams(temperature=0.0, max_tokens=5, logprobs=0, ignore_eos=True)),
    ]  # fmt: skip
    outs = generate(llm, [p for p, _ in cases], [params for _, params in cases])
    tokenizer = llm.get_tokenizer()
    sampled_ranks = []
    for (prompt, params), out in zip(cases, outs, strict=True):
        completion = out.outputs[0]
        chosen = list(completion.token_ids)

        def replay(row: torch.Tensor, done: list[int], chosen: list[int] = chosen) -> int:
            return chosen[len(done)]

        _, logits = reference_decode(llm.llm_engine, prompt, len(chosen), pick=replay)
        assert len(completion.logprobs) == len(chosen) == params.max_tokens
        for token, position, row in zip(chosen, completion.logprobs, logits, strict=True):
            check_position(position, token, row, params.logprobs, tokenizer)
            if params.temperature == 0.0:
                assert token == greedy(row, [])
            else:
                sampled_ranks.append(position[token].rank)
        total = 0.0
        for token, position in zip(chosen, completion.logprobs, strict=True):
            total += position[token].logprob
        assert completion.cumulative_logprob == total
    # The random request did sample below the top: the sampled token was reported, not the best.
    assert max(sampled_ranks) > 1


def test_detokenize_false_gives_the_same_tokens_and_decodes_none(llm, monkeypatch):
    """As upstream: the same tokens and logprobs, with an empty text and no token texts; the
    tokenizer is never called for the request (it would fail the request here)."""
    params = SamplingParams(temperature=0.0, max_tokens=5, logprobs=2, prompt_logprobs=1,
                            ignore_eos=True)  # fmt: skip
    (decoded,) = generate(llm, [PROMPTS[0]], params)

    def no_decode(*args, **kwargs):
        raise AssertionError("a detokenize=False request was decoded")

    monkeypatch.setattr(llm.get_tokenizer(), "decode", no_decode)
    (raw,) = generate(llm, [PROMPTS[0]], replace(params, detokenize=False))
    completion = raw.outputs[0]
    assert completion.finish_reason == "length" and completion.text == ""
    assert decoded.outputs[0].text != ""
    assert completion.token_ids == decoded.outputs[0].token_ids
    positions = [*completion.logprobs, *raw.prompt_logprobs[1:]]
    expected = [*decoded.outputs[0].logprobs, *decoded.prompt_logprobs[1:]]
    for position, reference in zip(positions, expected, strict=True):
        assert {t: lp.logprob for t, lp in position.items()} == {
            t: lp.logprob for t, lp in reference.items()
        }
        assert all(lp.decoded_token is None for lp in position.values())
    assert_engine_cache_free(llm)


@pytest.mark.parametrize("flag, count", [(True, 1), (False, 0)])
def test_bool_logprobs_give_the_outputs_of_their_count(llm, flag, count):
    """Upstream scripts pass `logprobs=True` (and `prompt_logprobs=True`): the outputs have the
    shape and values of the count it stands for, as upstream's."""
    base = dict(temperature=0.0, max_tokens=4, ignore_eos=True)
    params = [SamplingParams(**base, logprobs=v, prompt_logprobs=v) for v in (flag, count)]
    as_bool, as_int = (generate(llm, [PROMPTS[0]], p)[0] for p in params)
    assert as_bool.outputs == as_int.outputs and as_bool.prompt_logprobs == as_int.prompt_logprobs
    positions = [*as_bool.outputs[0].logprobs, *as_bool.prompt_logprobs[1:]]
    assert len(positions) == base["max_tokens"] + len(PROMPTS[0]) - 1
    # The chosen token, and the top `count` (the greedy token, which is the chosen one here).
    assert all(1 <= len(position) <= 1 + count for position in positions)
    assert_engine_cache_free(llm)


@pytest.fixture(scope="module")
def chunked_llm(torch_reference_kernels):
    llm = LLM(MODEL, **dict(ARGS, max_num_seqs=2, max_num_batched_tokens=5))
    yield llm
    llm.shutdown()


@pytest.mark.parametrize("chunked", [False, True])
def test_prompt_logprobs_are_the_models_log_softmax(llm, chunked_llm, chunked):
    engine_llm = chunked_llm if chunked else llm
    prompt = PROMPTS[2] + PROMPTS[0]  # 19 tokens: four chunks of at most 5
    params = SamplingParams(temperature=0.0, max_tokens=2, prompt_logprobs=2, n=2)
    plain = SamplingParams(temperature=0.0, max_tokens=3)
    out, _ = generate(engine_llm, [prompt, PROMPTS[1]], [params, plain])
    assert out.prompt_token_ids == prompt
    assert len(out.prompt_logprobs) == len(prompt) and out.prompt_logprobs[0] is None
    logits = prompt_logits(engine_llm.llm_engine, prompt)
    tokenizer = engine_llm.get_tokenizer()
    for j in range(1, len(prompt)):
        check_position(out.prompt_logprobs[j], prompt[j], logits[j - 1], 2, tokenizer)
    # The completions' own first token comes from the last prompt position.
    assert all(c.token_ids[0] == int(logits[-1].argmax()) for c in out.outputs)
    assert_engine_cache_free(engine_llm)


# -- stopping -------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def boundary_stop(llm):
    """A stop string made of the last character of one greedy token's text and the first of the
    next: (prompt, greedy tokens, their text, the string, where it starts, how many tokens it
    takes to complete it). Found in the model's own output, which is fixed by its weights."""
    tokenizer = llm.get_tokenizer()
    max_tokens = 16
    for prompt in PROMPTS:
        tokens = greedy_tokens(llm, prompt, max_tokens)
        text = tokenizer.decode(tokens)
        for i in range(1, max_tokens):
            head = tokenizer.decode(tokens[:i])
            end = len(head)
            stop = text[end - 1 : end + 1]
            if (
                end == 0
                or not text.startswith(head)
                or len(stop) != 2
                or "\ufffd" in stop
                or text.count(stop) != 1
            ):
                continue
            needed = next(
                m for m in range(i + 1, max_tokens + 1)
                if tokenizer.decode(tokens[:m]).startswith(text[: end + 1])
            )  # fmt: skip
            return prompt, tokens, text, stop, end - 1, needed
    pytest.fail("no greedy output of PROMPTS has two tokens ending and starting in plain text")


@pytest.mark.parametrize("include", [False, True])
def test_stop_string_across_a_token_boundary(llm, boundary_stop, include):
    prompt, tokens, text, stop, start, needed = boundary_stop
    params = SamplingParams(
        temperature=0.0, max_tokens=len(tokens), ignore_eos=True,
        stop=["never in this output \u2603", stop], include_stop_str_in_output=include,
    )  # fmt: skip
    (out,) = generate(llm, [prompt], params)
    completion = out.outputs[0]
    assert completion.finish_reason == "stop" and completion.stop_reason == stop
    assert list(completion.token_ids) == tokens[:needed]
    assert completion.text == text[: start + len(stop) if include else start]


def first_new_token(tokens: list[int], start: int) -> int:
    """The first index >= `start` whose token did not occur before it."""
    return next(j for j in range(start, len(tokens)) if tokens[j] not in tokens[:j])


@pytest.mark.parametrize("include", [False, True])
def test_stop_token_ids(llm, include):
    tokens = greedy_tokens(llm, PROMPTS[0], 12)
    j = first_new_token(tokens, 2)
    params = SamplingParams(temperature=0.0, max_tokens=12, stop_token_ids=[tokens[j]],
                            include_stop_str_in_output=include)  # fmt: skip
    (out,) = generate(llm, [PROMPTS[0]], params)
    completion = out.outputs[0]
    assert completion.finish_reason == "stop" and completion.stop_reason == tokens[j]
    # The stop token ends the token ids; its text is the stop string's, kept only if asked.
    assert list(completion.token_ids) == tokens[: j + 1]
    assert completion.text == llm.get_tokenizer().decode(tokens[: j + 1 if include else j])


@pytest.fixture
def eos_is_a_generated_token(llm, monkeypatch):
    """Make the tokenizer's eos the first new greedy token of PROMPTS[0] at index >= 2 (the tiny
    model's random weights never choose the real one). Returns (greedy tokens, that index)."""
    tokens = greedy_tokens(llm, PROMPTS[0], 12)
    j = first_new_token(tokens, 2)
    tokenizer = llm.get_tokenizer()
    monkeypatch.setattr(tokenizer, "eos_token", tokenizer.convert_ids_to_tokens([tokens[j]])[0])
    assert tokenizer.eos_token_id == tokens[j]
    return tokens, j


def test_eos_and_ignore_eos(llm, eos_is_a_generated_token):
    tokens, j = eos_is_a_generated_token
    (out,) = generate(llm, [PROMPTS[0]], SamplingParams(temperature=0.0, max_tokens=12))
    completion = out.outputs[0]
    assert completion.finish_reason == "stop" and completion.stop_reason is None
    assert list(completion.token_ids) == tokens[: j + 1]
    assert completion.text == llm.get_tokenizer().decode(tokens[:j])
    params = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
    (out,) = generate(llm, [PROMPTS[0]], params)
    assert tokens_of(out) == tokens and out.outputs[0].finish_reason == "length"


@pytest.mark.parametrize("ignore_eos", [False, True])
def test_eos_in_stop_token_ids_reports_as_eos(llm, eos_is_a_generated_token, ignore_eos):
    """As upstream, the eos is checked first: listing it in `stop_token_ids` too leaves
    `stop_reason` None, unless `ignore_eos` makes it a plain stop token."""
    tokens, j = eos_is_a_generated_token
    params = SamplingParams(temperature=0.0, max_tokens=12, stop_token_ids=[tokens[j]],
                            ignore_eos=ignore_eos)  # fmt: skip
    (out,) = generate(llm, [PROMPTS[0]], params)
    completion = out.outputs[0]
    assert list(completion.token_ids) == tokens[: j + 1]
    expected = tokens[j] if ignore_eos else None
    assert (completion.finish_reason, completion.stop_reason) == ("stop", expected)


@pytest.mark.parametrize("kind", ["eos", "stop_token_ids"])
def test_min_tokens_suppresses_stop_tokens_before_it(llm, eos_is_a_generated_token, kind):
    tokens, j = eos_is_a_generated_token
    stop_token = tokens[j]
    min_tokens = j + 2
    stop_token_ids = [stop_token] if kind == "stop_token_ids" else None
    params = SamplingParams(temperature=0.0, max_tokens=12, min_tokens=min_tokens,
                            ignore_eos=kind != "eos", stop_token_ids=stop_token_ids)  # fmt: skip

    def suppressed(row: torch.Tensor, done: list[int]) -> int:
        if len(done) < min_tokens:
            row = row.clone()
            row[stop_token] = -torch.inf
        return greedy(row, done)

    reference, _ = reference_decode(llm.llm_engine, PROMPTS[0], 12, pick=suppressed)
    if stop_token in reference:
        expected = reference[: reference.index(stop_token) + 1]
        reason = ("stop", stop_token if kind == "stop_token_ids" else None)
    else:
        expected, reason = reference, ("length", None)
    (out,) = generate(llm, [PROMPTS[0]], params)
    completion = out.outputs[0]
    assert stop_token not in completion.token_ids[:min_tokens]
    assert list(completion.token_ids) == expected
    assert (completion.finish_reason, completion.stop_reason) == reason


def test_min_tokens_holds_back_stop_strings(llm, boundary_stop):
    """A stop string completed within the first `min_tokens` tokens does not stop the request."""
    prompt, tokens, text, stop, _, needed = boundary_stop
    params = SamplingParams(temperature=0.0, max_tokens=len(tokens), ignore_eos=True,
                            stop=[stop], min_tokens=needed)  # fmt: skip
    (out,) = generate(llm, [prompt], params)
    completion = out.outputs[0]
    # The string occurs once in the greedy text: nothing stops the request later either.
    assert list(completion.token_ids) == tokens
    assert completion.text == text and completion.finish_reason == "length"


# -- repetition penalty ---------------------------------------------------------------------------


def test_repetition_penalty_changes_greedy_tokens_as_defined(llm):
    penalty, max_tokens = 1.8, 8
    prompt = list(range(0, 256, 3))  # many distinct tokens already seen

    def penalized(row: torch.Tensor, done: list[int]) -> int:
        seen = torch.zeros_like(row, dtype=torch.bool)
        seen[prompt + done] = True
        row = torch.where(seen, torch.where(row > 0, row / penalty, row * penalty), row)
        return greedy(row, done)

    expected, _ = reference_decode(llm.llm_engine, prompt, max_tokens, pick=penalized)
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True,
                            repetition_penalty=penalty)  # fmt: skip
    assert tokens_of(generate(llm, [prompt], params)[0]) == expected
    assert expected != greedy_tokens(llm, prompt, max_tokens)
