"""`/tokenize` of messages counts what a chat request with the same fields would prompt."""

from types import SimpleNamespace

from vllm.config.generation import GenerationConfig
from vllm.entrypoints.openai.protocol import ChatCompletionRequest, TokenizeRequest
from vllm.entrypoints.openai.serving_chat import OpenAIServingChat
from vllm.entrypoints.openai.serving_tokenization import OpenAIServingTokenization
from vllm.model_executor.model_loader.builtin import BUILTIN_MODELS
from vllm.transformers_utils.tokenizer import get_tokenizer

# The tiny template, with the tool names listed first when the request has tools.
TEMPLATE = (
    "{%- if tools %}tools: {% for t in tools %}{{ t['function']['name'] }} {% endfor %}"
    "<|eos|>\n{% endif -%}"
    "{%- for m in messages -%}{{ m['role'] + ': ' + (m['content'] or '') }}<|eos|>\n"
    "{%- endfor -%}{%- if add_generation_prompt -%}assistant: {%- endif -%}"
)
USER = [{"role": "user", "content": "weather in Paris?"}]
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {}}}]


def _servers() -> tuple[OpenAIServingChat, OpenAIServingTokenization]:
    tokenizer = get_tokenizer(BUILTIN_MODELS["kimi-k3-tiny"])
    tokenizer.chat_template = TEMPLATE
    config = SimpleNamespace(
        model_config=SimpleNamespace(
            max_model_len=4096, vocab_size=320, generation_config=GenerationConfig()
        )
    )
    engine = SimpleNamespace(tokenizer=tokenizer, config=config)
    chat = OpenAIServingChat(engine, ["m"], "m")
    return chat, OpenAIServingTokenization(engine, ["m"], "m", chat=chat)


def test_tokenize_renders_the_tools_as_chat_does() -> None:
    """`tools` was an unknown field to /tokenize (ignored): the count left the tools out."""
    chat, tokenization = _servers()
    with_tools = tokenization.tokenize(TokenizeRequest(messages=USER, tools=TOOLS))
    prompt = chat.render(ChatCompletionRequest(messages=USER, tools=TOOLS))
    assert "get_weather" in prompt
    assert with_tools.tokens == chat.tokenizer.encode(prompt, add_special_tokens=False)
    without = tokenization.tokenize(TokenizeRequest(messages=USER))
    assert with_tools.count > without.count


def test_tokenizer_info_reports_the_length_the_engine_serves() -> None:
    """/tokenizer_info's model_max_length is the engine's max_model_len, as /v1/models and
    /tokenize report it: it passed the tokenizer file's own value through (kimi-k3-tiny's 4096
    while serving 2048; 0 or -5 as written), which generation does not go by."""
    _, tokenization = _servers()
    assert tokenization.tokenizer.tokenizer_info()["model_max_length"] == 4096  # the file's
    for served in (2048, 8192):
        tokenization.max_model_len = served
        assert tokenization.tokenizer_info()["model_max_length"] == served
