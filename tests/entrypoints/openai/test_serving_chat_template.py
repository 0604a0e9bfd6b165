"""A request's own `chat_template` (chat and `/tokenize`): refused unless the server trusts request
templates, then rendered in place of the model's, with the request's `chat_template_kwargs`, for
the prompt and for finding the reply's own turn alike."""

from types import SimpleNamespace

import pytest

from vllm.config.generation import GenerationConfig
from vllm.entrypoints.openai.protocol import ChatCompletionRequest, TokenizeRequest
from vllm.entrypoints.openai.serving_chat import OpenAIServingChat
from vllm.entrypoints.openai.serving_engine import OpenAIError
from vllm.entrypoints.openai.serving_tokenization import OpenAIServingTokenization
from vllm.model_executor.model_loader.builtin import BUILTIN_MODELS
from vllm.reasoning.kimi_k3_reasoning_parser import THINK_START, KimiK3ReasoningParser
from vllm.transformers_utils.tokenizer import get_tokenizer

USER = [{"role": "user", "content": f"what does {THINK_START} mean?"}]
# Nothing like the model's template: each message in brackets, the generation prompt ">>", which
# opens a think block when `thinking` is set.
OWN = (
    "{{ greeting | default('') }}{% for m in messages %}[{{ m['content'] }}]{% endfor %}"
    "{% if add_generation_prompt %}>>{% if thinking %}" + THINK_START + "{% endif %}{% endif %}"
)


def _servers(trust: bool) -> tuple[OpenAIServingChat, OpenAIServingTokenization]:
    tokenizer = get_tokenizer(BUILTIN_MODELS["kimi-k3-tiny"])
    config = SimpleNamespace(
        model_config=SimpleNamespace(
            max_model_len=4096, vocab_size=320, generation_config=GenerationConfig()
        )
    )
    engine = SimpleNamespace(tokenizer=tokenizer, config=config)
    parser = KimiK3ReasoningParser(tokenizer)
    chat = OpenAIServingChat(
        engine, ["m"], "m", reasoning_parser=parser, trust_request_chat_template=trust
    )
    return chat, OpenAIServingTokenization(engine, ["m"], "m", chat=chat)


def test_a_requests_template_is_refused_unless_trusted() -> None:
    """A template is a program the server runs (as in vLLM, off unless the server opts in)."""
    chat, tokenization = _servers(trust=False)
    for call in (
        lambda: chat.render(ChatCompletionRequest(messages=USER, chat_template=OWN)),
        lambda: tokenization.tokenize(TokenizeRequest(messages=USER, chat_template=OWN)),
    ):
        with pytest.raises(OpenAIError, match="--trust-request-chat-template") as error:
            call()
        assert (error.value.code, error.value.param) == (400, "chat_template")


def test_a_trusted_requests_template_renders_the_prompt() -> None:
    chat, tokenization = _servers(trust=True)
    fields = {"chat_template": OWN, "chat_template_kwargs": {"greeting": "hey "}}
    prompt = chat.render(ChatCompletionRequest(messages=USER, **fields))
    assert prompt == f"hey [{USER[0]['content']}]>>"  # the request's kwargs reach it too
    counted = tokenization.tokenize(TokenizeRequest(messages=USER, **fields))
    assert counted.tokens == chat.tokenizer.encode(prompt, add_special_tokens=False)
    # The model's own template is still every other request's.
    assert chat.render(ChatCompletionRequest(messages=USER)).startswith("<|bos|>user: ")


@pytest.mark.parametrize(
    "template, param",
    [
        ("{% for m in messages %}", "chat_template"),  # does not parse
        ("{{ messages.pop() }}", "messages"),  # the sandbox refuses it
        ("{{ 1 + messages }}", "messages"),  # a TypeError, as the model's template's are 400s
        ("{% macro f() %}{{ f() }}{% endmacro %}{{ f() }}", "messages"),  # RecursionError
    ],
)
def test_a_trusted_template_that_fails_is_a_400(template: str, param: str) -> None:
    chat, _ = _servers(trust=True)
    with pytest.raises(OpenAIError, match="chat_template") as error:
        chat.render(ChatCompletionRequest(messages=USER, chat_template=template))
    assert (error.value.code, error.value.param) == (400, param)


@pytest.mark.parametrize("thinking, expected", [(True, True), (False, False)])
def test_the_replys_turn_is_found_with_the_requests_template(thinking, expected) -> None:
    """The reply's turn is what the request's template adds after the messages: the marker the
    user quotes is not the reply's (the model's template, rendering differently from the first
    character, made the whole prompt the reply's turn)."""
    chat, _ = _servers(trust=True)
    kwargs = {"thinking": thinking}
    request = ChatCompletionRequest(messages=USER, chat_template=OWN, chat_template_kwargs=kwargs)
    prompt = chat.render(request)
    assert chat.starts_in_reasoning(request, prompt) is expected, prompt


@pytest.mark.parametrize("field", ["reasoning_content", "reasoning"])
@pytest.mark.parametrize("sent", ["reasoning", "reasoning_content"])
def test_an_earlier_replys_reasoning_reaches_the_template_under_both_names(field, sent) -> None:
    """A client sends a reply back as it got it (`reasoning`, what chat replies carry) or under
    the older `reasoning_content`, which Kimi's templates read: a template reading either name
    sees it, as upstream passes both."""
    chat, tokenization = _servers(trust=True)
    template = (
        "{% for m in messages %}{% if m." + field + " %}<{{ m." + field + " }}>{% endif %}"
        "[{{ m['content'] }}]{% endfor %}"
    )
    messages = [
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": "four", sent: "2 + 2"},
        {"role": "user", "content": "why?"},
    ]
    request = ChatCompletionRequest(messages=messages, chat_template=template)
    assert chat.render(request) == "[q]<2 + 2>[four][why?]"
    # LLM.chat renders through the tokenizer alike, leaving the caller's messages as they are.
    tokenizer = chat.tokenizer
    rendered = tokenizer.apply_chat_template(messages, chat_template=template)
    assert rendered == "[q]<2 + 2>[four][why?]"
    assert messages[1] == {"role": "assistant", "content": "four", sent: "2 + 2"}


def test_reasoning_given_under_both_names_keeps_each_and_other_roles_get_no_alias() -> None:
    """Where a message gives both names, each keeps its own text; only assistant messages get
    the other name (as upstream)."""
    chat, _ = _servers(trust=True)
    template = "{% for m in messages %}<{{ m.reasoning }}|{{ m.reasoning_content }}>{% endfor %}"
    messages = [
        {"role": "user", "content": "q", "reasoning": "u"},
        {"role": "assistant", "content": "a", "reasoning": "new", "reasoning_content": "old"},
    ]
    rendered = chat.tokenizer.apply_chat_template(messages, chat_template=template)
    assert rendered == "<u|><new|old>"


@pytest.mark.parametrize("add_special_tokens", [None, False, True])
def test_chat_encodes_the_rendering_with_the_requests_add_special_tokens(
    add_special_tokens: bool | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """vLLM's chat field: false by default (the template holds the special tokens), true adds
    the tokenizer's own on top. It was taken and ignored as an unknown field."""
    chat, _ = _servers(trust=False)
    seen = []

    class Encoded(Exception):
        pass

    def encode(prompt, add_special_tokens, param):
        seen.append(add_special_tokens)
        raise Encoded

    monkeypatch.setattr(chat, "encode", encode)
    fields = {} if add_special_tokens is None else {"add_special_tokens": add_special_tokens}
    with pytest.raises(Encoded):
        chat._inputs(ChatCompletionRequest(messages=USER, **fields))
    assert seen == [bool(add_special_tokens)]
