"""Rendering chat messages with a Jinja chat template as HF does: the sandbox and its helpers,
the checks of the messages, the names an assistant's reasoning goes by, and where a rendering
ends when its final message is continued (HF's `continue_final_message`)."""

import functools
import json
import secrets
from datetime import datetime
from typing import Any

import jinja2
from jinja2 import nodes
from jinja2.ext import Extension, loopcontrols
from jinja2.parser import Parser
from jinja2.sandbox import ImmutableSandboxedEnvironment

CONTINUE_WITH_GENERATION_PROMPT = (
    "continue_final_message and add_generation_prompt cannot both be true: the generation prompt "
    "opens a new turn after the final message, which is then no longer continued (set "
    "add_generation_prompt to false, its default is true)"
)


def _tojson(value: Any, ensure_ascii: bool = False, **kwargs: Any) -> str:
    # Jinja's own tojson escapes <, >, & and ' for HTML, which would corrupt prompts.
    return json.dumps(value, ensure_ascii=ensure_ascii, **kwargs)


def _raise_exception(message: str) -> None:
    raise ValueError(f"chat template: {message}")


class _GenerationBlock(Extension):
    """HF's `{% generation %} ... {% endgeneration %}`, which marks the assistant's text for its
    training masks: a prompt needs only the body, rendered in a scope of its own as HF's is (a
    `set` inside is not seen after it). Without it such templates did not parse."""

    tags = {"generation"}

    def parse(self, parser: Parser) -> nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return nodes.Scope(body, lineno=lineno)


@functools.lru_cache(maxsize=32)
def compile_chat_template(source: str) -> jinja2.Template:
    """`source` compiled in the sandbox HF renders chat templates in (with its `tojson`,
    `raise_exception`, `strftime_now` and `generation` blocks); a `ValueError` if it does not
    parse. Cached by text, so a caller's own template is parsed once, however many requests
    bring it."""
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols, _GenerationBlock]
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    try:
        return env.from_string(source)
    except jinja2.TemplateSyntaxError as e:
        raise ValueError(f"chat_template does not parse: {e}") from e
    except (SyntaxError, RecursionError) as e:
        # Jinja's parser recurses per nested expression and compiles the template to Python,
        # which refuses over 20 nested loops or 100 levels of indentation.
        raise ValueError(f"chat_template does not parse: nested too deeply ({e})") from e


class RenderingTooLong(ValueError):
    """A rendering that grew past the caller's `max_chars`."""


def render_within(template: jinja2.Template, variables: dict[str, Any], max_chars: int) -> str:
    """`template.render(variables)`, stopped with `RenderingTooLong` as soon as the text grows
    past `max_chars` characters. A template writes some variables once per message (an
    `eos_token` replaced through `chat_template_kwargs`, say), so its text may be thousands of
    times its input: a 500 kB eos_token after each of 2,000 one-word messages is a gigabyte of
    prompt from a 1 MB request, which filled the server's memory before the prompt's length was
    ever checked. Piece by piece, no more than the limit and the piece that crossed it is held."""
    pieces, size = [], 0
    for piece in template.generate(variables):
        size += len(piece)
        if size > max_chars:
            raise RenderingTooLong(
                f"the chat template renders these messages to more than {max_chars} characters"
            )
        pieces.append(piece)
    return "".join(pieces)


def mark_final_message(messages: list[dict]) -> tuple[list[dict], str]:
    """`messages` with a unique stand-in appended to the final message's text, and the stand-in.

    The rendering is cut where the stand-in lands: HF instead looks for the message's text in
    the rendering, which a short text also matches inside the template's own markup (a final
    "end" found in "<|im_end|>"), and which an empty one matches at the very end (the message
    is left closed).

    The final message may have any role, as HF and upstream vLLM take it: a user's text left
    open is completed in the user's turn (the server answers in that role, as upstream). Only an
    assistant's message is the reply's own turn for the reasoning split (`OpenAIServingChat.
    reply_turn`): a think block opened in a user's text does not make the reply reasoning.
    """
    if not messages:
        raise ValueError("continue_final_message continues the final message: there is none")
    stand_in = f"CONTINUE{secrets.token_hex(16)}"
    content = messages[-1].get("content")
    if isinstance(content, list):
        if content:
            last = content[-1]
            content = [*content[:-1], {**last, "text": last["text"] + stand_in}]
        else:
            content = [{"type": "text", "text": stand_in}]
    elif content is None or isinstance(content, str):
        content = (content or "") + stand_in
    else:
        raise ValueError(
            "continue_final_message: the final message's content must be a string or a list of "
            f"text parts, got {type(content).__name__}"
        )
    return [*messages[:-1], {**messages[-1], "content": content}], stand_in


def cut_at_stand_in(text: str, stand_in: str) -> str:
    """The rendering up to where the final message's text ends (copies of it that the template
    rendered earlier keep their text, without the stand-in)."""
    end = text.rfind(stand_in)
    if end < 0:
        raise ValueError(
            "continue_final_message: the chat template does not render the final message's "
            "text as given, so there is no place to continue it from"
        )
    return text[:end].replace(stand_in, "")


def check_messages(messages: Any) -> None:
    """A list of dicts, each with a 'role', whose list contents hold text parts only: the engine
    reads no images or audio, and the templates drop parts they do not know, so a message of an
    image alone would be answered as if it were empty."""
    if not isinstance(messages, list) or not all(
        isinstance(m, dict) and "role" in m for m in messages
    ):
        raise ValueError("messages must be a list of dicts, each with a 'role'")
    for i, message in enumerate(messages):
        content = message.get("content")
        if content is None or isinstance(content, str):  # None: e.g. a turn of tool calls
            continue
        if not isinstance(content, list):
            raise ValueError(
                f"messages[{i}].content must be a string or a list of text parts, got "
                f"{type(content).__name__}"
            )
        for j, part in enumerate(content):
            kind = part.get("type") if isinstance(part, dict) else None
            if kind != "text" or not isinstance(part.get("text"), str):
                shown = f"type {kind!r}" if isinstance(kind, str) else "no type"
                raise ValueError(
                    f"messages[{i}].content[{j}]: only text parts ({{'type': 'text', 'text': "
                    f"str}}) are supported, got a part with {shown}"
                )


def with_reasoning_aliases(messages: list[dict]) -> list[dict]:
    """`messages` where an assistant message that gives its thinking as `reasoning` (the field
    chat replies carry it in, so what a client sends back) or as `reasoning_content` (the older
    name, which Kimi's and most other templates read) has it under both, as upstream passes
    them: a template reading either sees it. The caller's dicts are left as they are."""
    out = []
    for message in messages:
        if message.get("role") == "assistant":
            reasoning, legacy = message.get("reasoning"), message.get("reasoning_content")
            if reasoning is not None and legacy is None:
                message = {**message, "reasoning_content": reasoning}
            elif legacy is not None and reasoning is None:
                message = {**message, "reasoning": legacy}
        out.append(message)
    return out
