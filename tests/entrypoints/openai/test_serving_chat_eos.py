"""Chat with the kimi_k3 reasoning parser on a tokenizer whose marker pieces are special tokens
(so replies keep special tokens): which eos text the reply loses, and that the streamed deltas
still add up to the non-streamed message. Through the chat handler, as the server calls it, over
an engine that replies with scripted outputs."""

import asyncio
import json
from types import SimpleNamespace

import pytest

from vllm.config.generation import GenerationConfig
from vllm.entrypoints.openai.protocol import ChatCompletionRequest
from vllm.entrypoints.openai.serving_chat import OpenAIServingChat
from vllm.model_executor.model_loader.builtin import resolve_model
from vllm.outputs import CompletionOutput, RequestOutput
from vllm.reasoning.kimi_k3_reasoning_parser import KimiK3ReasoningParser
from vllm.transformers_utils.tokenizer import get_tokenizer

EOS, EOS_ID = "<|eos|>", 257
MARKER_IDS = {"<|open|>": 300, "<|close|>": 301, "<|sep|>": 302}


class MarkerTokenizer:
    """The tiny model's tokenizer (its chat template, `<|eos|>` = 257), with the think markers'
    pieces as special tokens, as Kimi-K3's are."""

    def __init__(self) -> None:
        self.base = get_tokenizer(resolve_model("kimi-k3-tiny")[0])
        assert (self.base.eos_token, self.base.eos_token_id) == (EOS, EOS_ID)
        self.all_special_ids = [*self.base.all_special_ids, *MARKER_IDS.values()]

    def token_to_id(self, token: str) -> int | None:
        return MARKER_IDS.get(token, self.base.token_to_id(token))

    def __getattr__(self, name: str):
        return getattr(self.base, name)


class ScriptedEngine:
    """What the chat handler uses of `AsyncLLM`: every request gets the cumulative outputs of
    `steps` ((text, token ids, finish reason, stop reason) each), one at a time."""

    def __init__(self, steps: list[tuple], eos_token_ids: tuple[int, ...] = ()) -> None:
        self.tokenizer = MarkerTokenizer()
        self.config = SimpleNamespace(
            model_config=SimpleNamespace(
                max_model_len=128,
                vocab_size=320,
                logprobs_limit=20,
                generation_config=GenerationConfig("test", eos_token_ids),
            )
        )
        self.steps = steps

    async def add_request(self, request_id: str, prompt: list[int], params, arrival=None):
        async def outputs():
            for text, token_ids, finish_reason, stop_reason in self.steps:
                c = CompletionOutput(
                    0,
                    text,
                    token_ids,
                    None,
                    None,
                    finish_reason=finish_reason,
                    stop_reason=stop_reason,
                )
                yield RequestOutput(request_id, None, prompt, None, [c], finish_reason is not None)

        return outputs()

    def abort(self, request_id: str) -> None:
        pass


async def _streamed_and_whole(
    fields: dict, steps: list[tuple], eos_token_ids: tuple[int, ...] = ()
) -> tuple[str, str]:
    """The reply's content from the deltas of a streamed request, and from a non-streamed one."""
    engine = ScriptedEngine(steps, eos_token_ids)
    parser = KimiK3ReasoningParser(engine.tokenizer)
    assert parser.needs_special_tokens
    chat = OpenAIServingChat(engine, ["tiny"], "tiny", reasoning_parser=parser)
    messages = [{"role": "user", "content": "hi"}]
    whole = await chat.create_chat_completion(ChatCompletionRequest(messages=messages, **fields))
    events = await chat.create_chat_completion(
        ChatCompletionRequest(messages=messages, stream=True, **fields)
    )
    streamed = ""
    async for event in events:
        data = event.removeprefix("data: ").strip()
        if data != "[DONE]":
            for choice in json.loads(data)["choices"]:
                streamed += choice["delta"].get("content") or ""
    return streamed, whole.choices[0].message.content


@pytest.mark.parametrize(
    "steps, fields, expected",
    [
        # The model wrote eos under ignore_eos, then a stop string ended the reply: that eos
        # was streamed as text before the reply ended, so it is part of the answer.
        ([("ok" + EOS, [1, 2, EOS_ID], None, None),
          ("ok" + EOS, [1, 2, EOS_ID, 3, 4], "stop", "ST")],
         {"ignore_eos": True, "stop": ["ST"]}, "ok" + EOS),
        # The same with the reply cut by max_tokens on a token without text.
        ([("ok" + EOS, [1, 2, EOS_ID], None, None),
          ("ok" + EOS, [1, 2, EOS_ID, 300], "length", None)],
         {"ignore_eos": True}, "ok" + EOS),
        # The eos that ended the reply, in the text only because of include_stop_str_in_output.
        ([("ok", [1, 2], None, None), ("ok" + EOS, [1, 2, EOS_ID], "stop", None)],
         {"include_stop_str_in_output": True}, "ok"),
    ],
)  # fmt: skip
def test_streamed_chat_equals_whole_chat_around_eos_text(steps, fields, expected):
    assert asyncio.run(_streamed_and_whole(fields, steps)) == (expected, expected)


PAD, PAD_ID = "<|pad|>", 258


@pytest.mark.parametrize(
    "steps, fields, expected",
    [
        # A generation-config eos (here <|pad|>, as Kimi's <|im_end|> beside its [EOS]) ended the
        # reply: like the tokenizer's eos, its text is no part of the answer.
        ([("ok", [1, 2], None, None), ("ok" + PAD, [1, 2, PAD_ID], "stop", PAD_ID)],
         {"include_stop_str_in_output": True}, "ok"),
        # Written mid-reply under ignore_eos, it stays.
        ([("ok" + PAD, [1, 2, PAD_ID], None, None),
          ("ok" + PAD, [1, 2, PAD_ID, 3, 4], "stop", "ST")],
         {"ignore_eos": True, "stop": ["ST"]}, "ok" + PAD),
        # One that is no special token (33, "B") is text like a request's stop token: kept,
        # as include_stop_str_in_output asks.
        ([("ok", [1, 2], None, None), ("okB", [1, 2, 33], "stop", 33)],
         {"include_stop_str_in_output": True}, "okB"),
    ],
)  # fmt: skip
def test_generation_config_eos_text_leaves_the_reply_as_the_tokenizer_eos(steps, fields, expected):
    result = asyncio.run(_streamed_and_whole(fields, steps, eos_token_ids=(EOS_ID, PAD_ID, 33)))
    assert result == (expected, expected)
