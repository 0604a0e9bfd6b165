"""Whether a chat reply starts inside a think block: only one that the reply's own turn (the
generation prompt, or a final message it continues) opened counts, not a marker that an earlier
message quotes or an earlier turn left unclosed."""

import pytest

from vllm.entrypoints.openai.protocol import ChatCompletionRequest
from vllm.entrypoints.openai.serving_chat import OpenAIServingChat
from vllm.model_executor.model_loader.builtin import BUILTIN_MODELS
from vllm.reasoning.kimi_k3_reasoning_parser import THINK_END, THINK_START, KimiK3ReasoningParser
from vllm.transformers_utils.tokenizer import get_tokenizer

# The tiny template, with a generation prompt that opens a think block when `thinking` is set.
TEMPLATE = (
    "{%- for m in messages -%}{{ m['role'] + ': ' + (m['content'] or '') }}"
    "{%- if not loop.last or add_generation_prompt %}<|eos|>\n{% endif -%}{%- endfor -%}"
    "{%- if add_generation_prompt -%}assistant: "
    "{%- if thinking | default(false) %}" + THINK_START + "{% endif -%}{%- endif -%}"
)


# Closes every message, the final one too (as Kimi's template does with <|im_end|>).
CLOSING = (
    "{%- for m in messages -%}{{ m['role'] + ': ' + (m['content'] or '') }}<|eos|>\n"
    "{%- endfor -%}{%- if add_generation_prompt -%}assistant: {%- endif -%}"
)


def _chat(template: str = TEMPLATE) -> OpenAIServingChat:
    tokenizer = get_tokenizer(BUILTIN_MODELS["kimi-k3-tiny"])
    tokenizer.chat_template = template
    # Only the parts `render` and `starts_in_reasoning` read: no engine is needed.
    chat = OpenAIServingChat.__new__(OpenAIServingChat)
    chat.tokenizer, chat.reasoning_parser = tokenizer, KimiK3ReasoningParser(tokenizer)
    chat.max_prompt_chars = None
    return chat


QUOTED = f"what does {THINK_START} mean?"
UNCLOSED = f"{THINK_START}an earlier turn's thought, never closed"
CONTINUE = {"add_generation_prompt": False, "continue_final_message": True}


@pytest.mark.parametrize(
    "messages, fields, expected",
    [
        # The block is the generation prompt's.
        ([{"role": "user", "content": "hi"}], {"chat_template_kwargs": {"thinking": True}}, True),
        ([{"role": "user", "content": QUOTED}], {"chat_template_kwargs": {"thinking": True}},
         True),
        # A marker in an earlier message does not open the reply's block.
        ([{"role": "user", "content": QUOTED}], {}, False),
        ([{"role": "user", "content": "hi"}, {"role": "assistant", "content": UNCLOSED},
          {"role": "user", "content": "and now?"}], {}, False),
        # Without a generation prompt the final message is the reply's turn: its open block is.
        ([{"role": "user", "content": "hi"},
          {"role": "assistant", "content": f"{THINK_START}let me see"}],
         {"add_generation_prompt": False}, True),
        ([{"role": "user", "content": QUOTED},
          {"role": "assistant", "content": f"{THINK_START}done{THINK_END}so"}],
         {"add_generation_prompt": False}, False),
        # Without a generation prompt and a final assistant message, nothing is continued.
        ([{"role": "user", "content": QUOTED}], {"add_generation_prompt": False}, False),
        # A continued final message is the reply's turn: a block it opened and left open is the
        # reply's to go on with; one it closed, or one an earlier turn left open, is not.
        ([{"role": "user", "content": QUOTED},
          {"role": "assistant", "content": f"{THINK_START}let me see"}], CONTINUE, True),
        ([{"role": "user", "content": QUOTED},
          {"role": "assistant", "content": f"{THINK_START}done{THINK_END}so"}], CONTINUE, False),
        ([{"role": "user", "content": "hi"}, {"role": "assistant", "content": UNCLOSED},
          {"role": "user", "content": "and now?"}, {"role": "assistant", "content": "Well,"}],
         CONTINUE, False),
        # A continued user message is the user's text, not the assistant's thinking: a block it
        # left open does not make the reply reasoning.
        ([{"role": "user", "content": f"{THINK_START}let me see"}], CONTINUE, False),
        ([{"role": "user", "content": "hi"}, {"role": "assistant", "content": "ok"},
          {"role": "user", "content": f"{THINK_START}hm"}], CONTINUE, False),
    ],
)  # fmt: skip
def test_only_the_replys_own_turn_opens_its_think_block(messages, fields, expected) -> None:
    chat = _chat()
    request = ChatCompletionRequest(messages=messages, **fields)
    prompt = chat.render(request)
    assert chat.starts_in_reasoning(request, prompt) is expected, prompt


OPEN_FINAL = [{"role": "user", "content": "hi"},
              {"role": "assistant", "content": f"{THINK_START}let me see"}]  # fmt: skip


@pytest.mark.parametrize(
    "fields, expected",
    [
        # The template closed the final message: the reply starts a turn of its own.
        ({"add_generation_prompt": False}, False),
        # Continued, the message is left open, and its block with it.
        (CONTINUE, True),
    ],
)
def test_a_final_message_the_template_closed_leaves_no_block_open(fields, expected) -> None:
    chat = _chat(CLOSING)
    request = ChatCompletionRequest(messages=OPEN_FINAL, **fields)
    prompt = chat.render(request)
    assert chat.reasoning_parser.starts_in_reasoning(prompt)  # the marker is unclosed in the text
    assert chat.starts_in_reasoning(request, prompt) is expected, prompt


# Leaves the final message open, as TEMPLATE, but trims each message's text.
TRIMMING = TEMPLATE.replace("(m['content'] or '')", "((m['content'] or '') | trim)")


@pytest.mark.parametrize("tail", ["", "\n", "  "])
def test_a_template_that_trims_the_final_message_does_not_close_it(tail) -> None:
    # Continuing keeps the message's trailing spaces, which the trimmed rendering lacks: the
    # renderings differ, yet the template wrote nothing after the message.
    chat = _chat(TRIMMING)
    messages = [{"role": "user", "content": "hi"},
                {"role": "assistant", "content": f"{THINK_START}let me see{tail}"}]  # fmt: skip
    request = ChatCompletionRequest(messages=messages, add_generation_prompt=False)
    prompt = chat.render(request)
    assert chat.starts_in_reasoning(request, prompt), prompt
