"""Request bodies and response pieces in-process (no server): field limits, the legacy
completion logprobs and chat logprobs' bytes."""

import asyncio
import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from fake_engine import FakeEngine  # noqa: E402

from vllm.entrypoints.openai.protocol import (  # noqa: E402
    MAX_N,
    UNIMPLEMENTED_CHAT_FIELDS,
    UNIMPLEMENTED_COMPLETION_FIELDS,
    ChatCompletionRequest,
    CompletionRequest,
)
from vllm.entrypoints.openai.serving_chat import OpenAIServingChat, chat_logprobs  # noqa: E402
from vllm.entrypoints.openai.serving_completion import (  # noqa: E402
    OpenAIServingCompletion,
    TextOffsets,
    completion_logprobs,
)
from vllm.entrypoints.openai.serving_engine import OpenAIError  # noqa: E402
from vllm.model_executor.model_loader.builtin import resolve_model  # noqa: E402
from vllm.outputs import Logprob  # noqa: E402
from vllm.transformers_utils.tokenizer import get_tokenizer  # noqa: E402
from vllm.v1.engine.async_llm import AsyncLLM  # noqa: E402


@pytest.mark.parametrize("prompt", [[1, 2, 3], ["a", "b"], [[1], [2, 3]]])
def test_a_valid_prompt_list_is_not_checked_item_by_item(prompt: list, monkeypatch) -> None:
    """The item-by-item diagnosis of a list prompt is for one the union refuses: run on every
    valid one, in Python on the event loop, it made a million-token prompt's validation 7 times
    slower (30 to 220 ms), holding up every other stream meanwhile."""
    from vllm.entrypoints.openai import protocol

    def per_item(item):
        raise AssertionError("a valid prompt list was checked item by item")

    monkeypatch.setattr(protocol, "_prompt_item_kind", per_item)
    assert CompletionRequest.model_validate({"model": "m", "prompt": prompt}).prompt == prompt


@pytest.mark.parametrize("n", [MAX_N + 1, 2**62])
def test_n_over_the_limit_is_refused_before_the_engine_sees_it(n: int) -> None:
    # Every completion becomes a sequence when the request is added: 2**62 of them allocated
    # until the server was killed for memory.
    for request in (
        CompletionRequest(prompt="hi", n=n),
        ChatCompletionRequest(messages=[{"role": "user", "content": "hi"}], n=n),
    ):
        with pytest.raises(ValueError, match=f"n must be <= {MAX_N}"):
            request.sampling_params(max_tokens=1, logprobs=None)
    assert CompletionRequest(prompt="hi", n=MAX_N).sampling_params(1, None).n == MAX_N


class _ByteTokenizer:
    """Byte-level: a byte that is half a UTF-8 character decodes to U+FFFD, as in the models'
    tokenizers."""

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return bytes(ids).decode("utf-8", errors="replace")

    def token_bytes(self, token_id: int) -> bytes:
        return bytes([token_id])


USER = [{"role": "user", "content": "hi"}]
# A value of each unimplemented field that would change the reply.
_DISOBEYED = {
    "use_beam_search": True, "allowed_token_ids": [64], "bad_words": ["g"],
    "prompt_logprobs": 0, "return_tokens_as_token_ids": True,
    "return_token_ids": True, "logits_processors": ["x"],
    "structured_outputs": {"regex": "a+"}, "guided_json": {"type": "object"},
    "guided_regex": "a+", "guided_choice": ["a"], "guided_grammar": "root ::= 'a'",
    "priority": 1, "prompt_embeds": "AAAA", "tool_choice": "required", "echo": True,
    "documents": [{"text": "x"}],
}  # fmt: skip


@pytest.mark.parametrize(
    "name", sorted(UNIMPLEMENTED_CHAT_FIELDS.keys() | UNIMPLEMENTED_COMPLETION_FIELDS.keys())
)
def test_vllm_fields_this_server_lacks_are_refused_by_name(name: str) -> None:
    """A client written for vLLM that sends one of its request fields this server does not
    implement gets a refusal naming it, not a reply that disobeys it (unknown fields are only
    logged). Chat also refuses a `tool_choice` that asks for a tool call, and its `echo`."""
    value = _DISOBEYED[name]
    requests = []
    if name in UNIMPLEMENTED_CHAT_FIELDS:
        requests.append(ChatCompletionRequest(messages=USER, **{name: value}))
    if name in UNIMPLEMENTED_COMPLETION_FIELDS:
        requests.append(CompletionRequest(prompt="hi", **{name: value}))
    for request in requests:
        with pytest.raises(ValueError, match=f"^{name} is not supported by this server"):
            request.sampling_params(max_tokens=4, logprobs=None)
    named = {"type": "function", "function": {"name": "f"}}
    with pytest.raises(ValueError, match="^tool_choice is not supported"):
        ChatCompletionRequest(messages=USER, tool_choice=named).sampling_params(4, None)


def test_vllm_fields_this_server_lacks_pass_at_values_that_change_nothing() -> None:
    for name, neutral in UNIMPLEMENTED_CHAT_FIELDS.items():
        for value in neutral:
            ChatCompletionRequest(messages=USER, **{name: value}).sampling_params(4, None)
    for name, neutral in UNIMPLEMENTED_COMPLETION_FIELDS.items():
        for value in neutral:
            CompletionRequest(prompt="hi", **{name: value}).sampling_params(4, None)
    # Beam search's own knob alone, and a no-op of these tokenizers', change nothing.
    for fields in ({"length_penalty": 0.5}, {"spaces_between_special_tokens": False}):
        ChatCompletionRequest(messages=USER, **fields).sampling_params(4, None)
    # Completions has no tool_choice or echo of chat's kind: an unknown field is only logged,
    # and its own `echo` is implemented.
    CompletionRequest(prompt="hi", tool_choice="required", echo=True).sampling_params(4, None)


def test_top_logprobs_keep_the_likeliest_of_tokens_that_decode_alike() -> None:
    # "é" is C3 A9. At its second byte the model preferred A8 (also "\ufffd" alone): the prompt
    # token is not the greedy one, whatever its text says.
    tokenizer = _ByteTokenizer()
    text = "\ufffd"
    positions = [
        None,
        {0xA9: Logprob(-3.0, 2, text), 0xA8: Logprob(-1.0, 1, text)},
        {0x21: Logprob(-0.5, 1, "!"), 0x3F: Logprob(-0.5, 1, "?")},
    ]
    result = completion_logprobs([0xC3, 0xA9, 0x21], positions, tokenizer)
    assert result.token_logprobs == [None, -3.0, -0.5]
    assert result.top_logprobs == [None, {text: -1.0}, {"!": -0.5, "?": -0.5}]
    # What lm_eval's local-completions makes of it (the continuation: the last two tokens, then
    # the one generated): not greedy.
    api = pytest.importorskip("lm_eval.models.openai_completions").LocalCompletionsAPI
    choice = {"index": 0, "logprobs": result.model_dump()}
    generated = {"tokens": ["x"], "token_logprobs": [-0.1], "top_logprobs": [{"x": -0.1}]}
    for key, values in generated.items():
        choice["logprobs"][key] += values
    ((logprob, is_greedy),) = api.parse_logprobs({"choices": [choice]}, ctxlens=[1])
    assert logprob == -3.5 and is_greedy is False


def test_chat_logprob_bytes_join_into_the_reply() -> None:
    """OpenAI: `bytes` are the token's UTF-8 bytes, for characters split across tokens to be
    joined again. Those tokens' text alone is U+FFFD, whose bytes (EF BF BD) join into nothing."""
    tokenizer = get_tokenizer(resolve_model("kimi-k3-tiny")[0])
    reply = "é 日本"
    ids = tokenizer.encode(reply, add_special_tokens=False)
    assert len(ids) > len(reply)  # some tokens hold part of a character
    positions = []
    for i, tid in enumerate(ids):
        other = (
            ids[(i + 1) % len(ids)] if ids[(i + 1) % len(ids)] != tid else tokenizer.eos_token_id
        )
        positions.append(
            {
                tid: Logprob(-0.5, 1, tokenizer.decode([tid], skip_special_tokens=False)),
                other: Logprob(-1.0, 2, tokenizer.decode([other], skip_special_tokens=False)),
            }
        )
    content = chat_logprobs(ids, positions, 2, tokenizer).content
    assert bytes(b for entry in content for b in entry.bytes).decode() == reply
    for entry, tid, position in zip(content, ids, positions, strict=True):
        assert [t.bytes for t in entry.top_logprobs] == [
            list(tokenizer.token_bytes(i)) for i in position
        ]
        assert entry.top_logprobs[0].bytes == entry.bytes == list(tokenizer.token_bytes(tid))


def test_text_offsets_count_a_character_split_across_tokens_once() -> None:
    tokenizer = get_tokenizer(resolve_model("kimi-k3-tiny")[0])
    text = "aé日b!"
    ids = tokenizer.encode(text, add_special_tokens=False)
    assert len(ids) == 1 + 2 + 3 + 1 + 1  # one token per byte
    result = completion_logprobs(ids, [None] * len(ids), tokenizer)
    # The pieces of a character are all at its offset; the tokens after it where they are.
    assert result.text_offset == [0, 1, 1, 2, 2, 2, 3, 4]
    assert [text[o] for o in result.text_offset] == list("aéé日日日b!")
    # Across the chunks of a stream, split anywhere (also inside a character): the same.
    offsets, streamed = TextOffsets(), []
    for chunk in (ids[:2], ids[2:4], ids[4:]):
        streamed += completion_logprobs(chunk, [None] * len(chunk), tokenizer, offsets).text_offset
    assert streamed == result.text_offset


def test_text_offsets_after_an_unfinished_character() -> None:
    """A lead byte that the next token does not continue is a U+FFFD of its own: the next
    token's text starts after it (it was given the unfinished character's offset)."""
    tokenizer = get_tokenizer(resolve_model("kimi-k3-tiny")[0])
    id_of = {tokenizer.token_bytes(i): i for i in range(tokenizer.vocab_size)}
    pieces = b"a \xc9 \xc8 \x11 \xe3 \x80 b \xed \xa0 \x80 !"
    ids = [id_of[b] for b in pieces.split(b" ")]
    text = tokenizer.decode(ids)
    # E3 80 is one U+FFFD (a character's start); ED A0 80 three (a surrogate's bytes).
    assert text == "a\ufffd\ufffd\x11\ufffdb\ufffd\ufffd\ufffd!"
    expected = [0, 1, 2, 3, 4, 4, 5, 6, 7, 8, 9]
    assert completion_logprobs(ids, [None] * len(ids), tokenizer).text_offset == expected
    for cut in range(1, len(ids)):  # streamed, split anywhere
        offsets, streamed = TextOffsets(), []
        for chunk in (ids[:cut], ids[cut:]):
            positions = [None] * len(chunk)
            streamed += completion_logprobs(chunk, positions, tokenizer, offsets).text_offset
        assert streamed == expected, cut


def test_a_finished_replys_last_eos_is_at_the_end_of_its_text() -> None:
    """An eos ending a reply whose last character is unfinished comes after that character's
    U+FFFD, which the finished text holds (it was given the unfinished character's offset, one
    too small); a reply that goes on keeps it at the unfinished character. Streamed, with the
    eos alone in the last chunk: the same."""
    tokenizer = get_tokenizer(resolve_model("kimi-k3-tiny")[0])
    id_of = {tokenizer.token_bytes(i): i for i in range(tokenizer.vocab_size)}
    ids = [id_of[b"a"], id_of[b"\xe3"], tokenizer.eos_token_id]
    assert tokenizer.decode(ids, skip_special_tokens=True) == "a\ufffd"
    positions = [None] * len(ids)
    got = completion_logprobs(ids, positions, tokenizer, reply_from=0, finished=True)
    assert got.text_offset == [0, 1, 2]
    assert completion_logprobs(ids, positions, tokenizer, reply_from=0).text_offset == [0, 1, 1]
    offsets = TextOffsets()
    first = completion_logprobs(ids[:2], positions[:2], tokenizer, offsets, reply_from=0)
    last = completion_logprobs(ids[2:], positions[2:], tokenizer, offsets, 0, finished=True)
    assert first.text_offset + last.text_offset == [0, 1, 2]
    # Without a held byte, the end is where the text ends anyway.
    ids = [id_of[b"a"], tokenizer.eos_token_id]
    got = completion_logprobs(ids, positions[:2], tokenizer, reply_from=0, finished=True)
    assert got.text_offset == [0, 1]
    # Through the server, whole and streamed: the eos is the reply's finishing token.
    engine = FakeEngine("a")
    engine.script = [id_of[b"a"], id_of[b"\xe3"], tokenizer.eos_token_id]
    llm = AsyncLLM(engine)
    serving = OpenAIServingCompletion(llm, ["fake"], "fake")
    body = {"prompt": "x", "max_tokens": 5, "logprobs": 0,
            "stop_token_ids": [tokenizer.eos_token_id]}  # fmt: skip

    async def whole() -> list[int]:
        choice = (await serving.create_completion(CompletionRequest(**body))).choices[0]
        return choice.logprobs.text_offset

    async def streamed() -> list[int]:
        offsets = []
        async for event in await serving.create_completion(CompletionRequest(**body, stream=True)):
            data = event.removeprefix("data: ").strip()
            if data != "[DONE]":
                offsets += json.loads(data)["choices"][0]["logprobs"]["text_offset"]
        return offsets

    try:
        assert asyncio.run(whole()) == asyncio.run(streamed()) == [0, 1, 2]
    finally:
        llm.shutdown()


def test_text_offsets_skip_the_special_tokens_the_text_leaves_out() -> None:
    """With skip_special_tokens (the default) a special token in the reply is not in its text,
    so it moves the offsets on by nothing (they moved by the length of its name, "<|bos|>": every
    later token was 7 characters too far). An echoed prompt keeps its special tokens' text, and
    so does a reply with skip_special_tokens false."""
    llm = AsyncLLM(FakeEngine("a<|bos|>b"))
    serving = OpenAIServingCompletion(llm, ["fake"], "fake")
    body = {"prompt": "x<|bos|>y", "max_tokens": 3, "logprobs": 0, "echo": True}

    async def whole() -> tuple[str, list[str], list[int]]:
        choice = (await serving.create_completion(CompletionRequest(**body))).choices[0]
        return choice.text, choice.logprobs.tokens, choice.logprobs.text_offset

    async def streamed() -> tuple[str, list[str], list[int]]:
        text, tokens, offsets = "", [], []
        async for event in await serving.create_completion(CompletionRequest(**body, stream=True)):
            data = event.removeprefix("data: ").strip()
            if data != "[DONE]":
                (choice,) = json.loads(data)["choices"]
                text += choice["text"]
                tokens += choice["logprobs"]["tokens"]
                offsets += choice["logprobs"]["text_offset"]
        return text, tokens, offsets

    try:
        for run in (whole, streamed):
            text, tokens, offsets = asyncio.run(run())
            assert text == "x<|bos|>yab"
            assert len(tokens) == 6  # x <|bos|> y, then a <|bos|> b
            assert offsets == [0, 1, 8, 9, 10, 10], run.__name__
        body["skip_special_tokens"] = False
        for run in (whole, streamed):
            text, tokens, offsets = asyncio.run(run())
            assert text == "x<|bos|>ya<|bos|>b"
            assert offsets == [0, 1, 8, 9, 10, 17], run.__name__
    finally:
        llm.shutdown()


def test_chat_top_logprobs_minus_one_lists_the_whole_vocabulary() -> None:
    """Upstream's chat `top_logprobs: -1`: every entry of each position, whole and streamed,
    held to --max-logprobs like any count (a 400 saying how to lift it); completions' `logprobs`
    takes no -1, as upstream's does not."""
    engine = FakeEngine("ab")
    vocab = engine.config.model_config.vocab_size
    asked = []
    add = engine.add_request

    def add_request(request_id, prompt, params):
        asked.append(params.logprobs)
        add(request_id, prompt, params)

    engine.add_request = add_request
    llm = AsyncLLM(engine)
    chat = OpenAIServingChat(llm, ["fake"], "fake")
    completion = OpenAIServingCompletion(llm, ["fake"], "fake")
    body = {
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 2,
        "logprobs": True,
        "top_logprobs": -1,
    }

    async def whole() -> list[tuple[int, int]]:
        response = await chat.create_chat_completion(ChatCompletionRequest(**body))
        content = response.choices[0].logprobs.content
        return [(len(entry.top_logprobs), entry.top_logprobs[0].logprob) for entry in content]

    async def streamed() -> list[tuple[int, int]]:
        counts = []
        request = ChatCompletionRequest(**body, stream=True)
        async for event in await chat.create_chat_completion(request):
            data = event.removeprefix("data: ").strip()
            if data != "[DONE]":
                for choice in json.loads(data)["choices"]:
                    for entry in (choice.get("logprobs") or {}).get("content") or []:
                        top = entry["top_logprobs"]
                        counts.append((len(top), top[0]["logprob"]))
        return counts

    try:
        # The fake engine's max_logprobs (20) is below its vocabulary (320).
        with pytest.raises(OpenAIError, match="start it with --max-logprobs -1") as refused:
            asyncio.run(whole())
        assert refused.value.param == "top_logprobs" and asked == []
        engine.config.model_config.logprobs_limit = vocab  # --max-logprobs -1
        expected = [
            (len(engine._logprobs(t, vocab)), -0.5) for t in engine.script[:2]
        ]  # every entry the engine gave, the likeliest first
        assert asyncio.run(whole()) == asyncio.run(streamed()) == expected
        assert asked == [vocab, vocab]  # the engine is asked for the vocabulary's count
        for logprobs in (-1, -2):
            request = CompletionRequest(prompt="hi", max_tokens=2, logprobs=logprobs)
            with pytest.raises(OpenAIError, match="logprobs must be >= 0") as refused:
                asyncio.run(completion.create_completion(request))
            assert refused.value.param == "logprobs"
    finally:
        llm.shutdown()
