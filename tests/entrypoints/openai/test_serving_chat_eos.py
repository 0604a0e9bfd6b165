"""Chat with the kimi_k3 reasoning parser on a tokenizer whose marker pieces are special tokens
(so replies keep special tokens): which eos text the reply loses, and that the streamed deltas
still add up to the non-streamed message."""

from types import SimpleNamespace

import pytest

from vllm.entrypoints.openai.protocol import ChatCompletionRequest
from vllm.entrypoints.openai.serving_chat import OpenAIServingChat
from vllm.outputs import CompletionOutput
from vllm.reasoning.kimi_k3_reasoning_parser import KimiK3ReasoningParser

EOS, EOS_ID, TEXT_ID = "<|eos|>", 257, 65


def _chat() -> OpenAIServingChat:
    ids = {"<|open|>": 300, "<|close|>": 301, "<|sep|>": 302, EOS: EOS_ID}
    tokenizer = SimpleNamespace(
        all_special_ids=list(ids.values()), token_to_id=ids.get, eos_token=EOS, eos_token_id=EOS_ID
    )
    parser = KimiK3ReasoningParser(tokenizer)
    assert parser.needs_special_tokens
    # Only the parts `_split` and `_delta` read: no engine is needed.
    chat = OpenAIServingChat.__new__(OpenAIServingChat)
    chat.tokenizer, chat.reasoning_parser = tokenizer, parser
    return chat


def _streamed_and_whole(request, steps):
    """Content from the deltas of cumulative outputs `steps`, and from the last one alone."""
    chat, sent, streamed = _chat(), {0: (0, 0, 0)}, ""
    for text, token_ids, finish_reason, stop_reason in steps:
        c = CompletionOutput(0, text, token_ids, None, None, finish_reason, stop_reason)
        piece = chat._delta(request, c, False, sent, None)
        if piece is not None:
            streamed += piece.delta.content or ""
    return streamed, chat._split(request, c, False)[1]


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
    request = ChatCompletionRequest(messages=[{"role": "user", "content": "hi"}], **fields)
    assert _streamed_and_whole(request, steps) == (expected, expected)
