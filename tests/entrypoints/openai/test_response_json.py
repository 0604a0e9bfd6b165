"""`response_json` in-process: the bytes of `JSONResponse(model.model_dump())`, for completions
and chat replies with logprobs, whole and in pieces as small as one item or character; a
thread waiting for the GIL takes it many times while a large answer is written; and the
response models have none of the custom serialization that writing them field by field would
skip."""

import random
import typing

import pytest
from fastapi.responses import JSONResponse
from gil_turns import gil_turns
from pydantic import BaseModel

from vllm.entrypoints.openai import response_json as response_json_module
from vllm.entrypoints.openai.protocol import (
    ChatCompletionChoice,
    ChatCompletionResponse,
    ChatLogProb,
    ChatLogProbs,
    ChatLogProbsContent,
    ChatResponseMessage,
    CompletionChoice,
    CompletionLogProbs,
    CompletionResponse,
    UsageInfo,
)
from vllm.entrypoints.openai.response_json import response_json

# What JSON escapes, or writes in more than one way: quotes, backslashes, control characters,
# line separators, astral characters, and floats that repr writes with an exponent.
TOKENS = ['"', "\\", "\x00", "\x1f", "\n", "\u2028", "\x7f", "é", "世", "🙂", "</script>", ""]
FLOATS = [0.0, -0.0, 1e-05, -1e-300, 5e-324, -9999.0, 0.1 + 0.2, -1.5, 1e16, -123456789.125]


def _completion(n: int, seed: int = 0) -> CompletionResponse:
    """A completion echoing an `n`-token prompt with logprobs: the first token has none, as
    the engine leaves it."""
    rng = random.Random(seed)
    logprobs = CompletionLogProbs()
    for i in range(n):
        token = rng.choice(TOKENS) + rng.choice(TOKENS)
        logprobs.tokens.append(token)
        logprobs.text_offset.append(i)
        if i == 0:
            logprobs.token_logprobs.append(None)
            logprobs.top_logprobs.append(None)
        else:
            logprobs.token_logprobs.append(rng.choice(FLOATS))
            logprobs.top_logprobs.append({token: rng.choice(FLOATS), "x": rng.choice(FLOATS)})
    text = "".join(rng.choice(TOKENS) for _ in range(3 * n))
    choices = [
        CompletionChoice(index=0, text=text, logprobs=logprobs, finish_reason="length"),
        CompletionChoice(index=1, text="", logprobs=CompletionLogProbs(), stop_reason=7),
    ]
    return CompletionResponse(id="cmpl-1", model="m", choices=choices, usage=UsageInfo.of(n, 2))


def _chat(n: int, seed: int = 0) -> ChatCompletionResponse:
    """A chat reply of `n` tokens with 3 top logprobs each, and one without logprobs."""
    rng = random.Random(seed)

    def entry(cls: type[ChatLogProb], **extra) -> ChatLogProb:
        token = rng.choice(TOKENS)
        return cls(token=token, logprob=rng.choice(FLOATS), bytes=list(token.encode()), **extra)

    content = [
        entry(ChatLogProbsContent, top_logprobs=[entry(ChatLogProb) for _ in range(3)])
        for _ in range(n)
    ]
    message = ChatResponseMessage(content="".join(rng.choice(TOKENS) for _ in range(n)))
    choices = [
        ChatCompletionChoice(
            index=0, message=message, logprobs=ChatLogProbs(content=content), finish_reason="stop"
        ),
        ChatCompletionChoice(index=1, message=ChatResponseMessage(reasoning="why\n")),
    ]
    return ChatCompletionResponse(id="chat-1", model="m", choices=choices, usage=UsageInfo())


@pytest.mark.parametrize("items, chars", [(1, 1), (2, 3), (7, 100), (256, 1 << 16)])
@pytest.mark.parametrize("make", [_completion, _chat])
@pytest.mark.parametrize("n", [0, 1, 300])
def test_the_bytes_are_jsonresponses(
    monkeypatch: pytest.MonkeyPatch, make, n: int, items: int, chars: int
) -> None:
    monkeypatch.setattr(response_json_module, "_ITEMS", items)
    monkeypatch.setattr(response_json_module, "_CHARS", chars)
    model = make(n)
    assert response_json(model) == JSONResponse(model.model_dump()).body


def test_a_nan_is_refused_as_jsonresponse_refuses_it() -> None:
    model = _completion(3)
    model.choices[0].logprobs.token_logprobs[2] = float("nan")
    with pytest.raises(ValueError, match="Out of range float values are not JSON compliant"):
        JSONResponse(model.model_dump())
    with pytest.raises(ValueError, match="Out of range float values are not JSON compliant"):
        response_json(model)


def test_writing_a_large_answer_lets_other_threads_run() -> None:
    """While the answer echoing a 100k-token prompt with logprobs (6.6 MB) is written, a thread
    waiting for the GIL (the server's event loop) takes it many times: `JSONResponse(model_dump())`
    held it throughout its two calls (5 turns in 0.2 s here). Counted in the thread's turns, not
    in time: waiting, it asks for the GIL after the switch interval (1 us here) and gets it at the
    next point between two bytecodes, of which the writing's 3,200 pieces give about a thousand."""
    model = _completion(100_000)
    body, during = gil_turns(lambda: response_json(model))
    assert len(body) > 6_000_000
    assert during >= 100, during


def _models(cls: type[BaseModel], seen: set) -> None:
    """`cls` and every model its fields' types name, into `seen`."""
    if cls in seen:
        return
    seen.add(cls)
    for field in cls.model_fields.values():
        pending = [field.annotation]
        while pending:
            annotation = pending.pop()
            if typing.get_origin(annotation) is None and isinstance(annotation, type):
                if issubclass(annotation, BaseModel):
                    _models(annotation, seen)
            else:
                pending.extend(typing.get_args(annotation))


@pytest.mark.parametrize("response", [CompletionResponse, ChatCompletionResponse])
def test_the_response_models_have_no_custom_serialization(response: type[BaseModel]) -> None:
    """`response_json` walks a model's fields as they are: a serializer, a computed field or an
    excluded one would change `model_dump()` but not its walk."""
    seen: set = set()
    _models(response, seen)
    assert ChatLogProb in seen or CompletionLogProbs in seen
    for cls in seen:
        decorators = cls.__pydantic_decorators__
        assert not decorators.field_serializers and not decorators.model_serializers, cls
        assert not cls.model_computed_fields, cls
        assert not any(field.exclude for field in cls.model_fields.values()), cls
