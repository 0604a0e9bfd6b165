"""/v1/completions and /v1/chat/completions take the sampling fields a request leaves out (or
sends as null) from the model's generation_config.json, and never override one it sends (1.0 and
0 included); its max_new_tokens caps max_tokens, as upstream."""

import json
from types import SimpleNamespace

import pytest

from vllm.config.generation import load_generation_config
from vllm.entrypoints.openai.protocol import ChatCompletionRequest, CompletionRequest
from vllm.entrypoints.openai.serving_chat import OpenAIServingChat
from vllm.entrypoints.openai.serving_completion import OpenAIServingCompletion
from vllm.entrypoints.openai.serving_engine import OpenAIError
from vllm.model_executor.model_loader.builtin import BUILTIN_MODELS
from vllm.transformers_utils.configs import load_model_config
from vllm.transformers_utils.tokenizer import get_tokenizer

MODEL = BUILTIN_MODELS["kimi-k3-tiny"]
GENERATION = {"temperature": 0.6, "top_p": 0.8, "top_k": 20, "max_new_tokens": 10}


def _servers(tmp_path, setting: str = "auto"):
    (tmp_path / "generation_config.json").write_text(json.dumps(GENERATION))
    generation = load_generation_config(setting, tmp_path, load_model_config(MODEL))
    model_config = SimpleNamespace(
        max_model_len=4096, vocab_size=320, logprobs_limit=20, generation_config=generation
    )
    engine = SimpleNamespace(tokenizer=get_tokenizer(MODEL), config=SimpleNamespace(
        model_config=model_config
    ))  # fmt: skip
    return OpenAIServingChat(engine, ["m"], "m"), OpenAIServingCompletion(engine, ["m"], "m")


def _params(tmp_path, body: dict, setting: str = "auto"):
    chat, completion = _servers(tmp_path, setting)
    messages = [{"role": "user", "content": "hi"}]
    chat_params = chat._inputs(ChatCompletionRequest.model_validate({**body, "messages": messages}))
    (_, _, completion_params), = completion._inputs(
        CompletionRequest.model_validate({**body, "prompt": "hi"})
    )  # fmt: skip
    return chat_params[1], completion_params


@pytest.mark.parametrize("body", [{}, {"temperature": None, "top_p": None, "top_k": None}])
def test_unset_fields_take_the_generation_config(tmp_path, body):
    for params in _params(tmp_path, body):
        assert (params.temperature, params.top_p, params.top_k) == (0.6, 0.8, 20)
        assert (params.min_p, params.repetition_penalty) == (0.0, 1.0)  # vLLM's: not in the file
        assert params.max_tokens == 10  # chat: none asked for; completions: 16, capped


@pytest.mark.parametrize("temperature", [1.0, 0.0, 0.3])
def test_sent_fields_win(tmp_path, temperature):
    body = {"temperature": temperature, "top_p": 1.0, "top_k": 0, "max_tokens": 4}
    for params in _params(tmp_path, body):
        assert params.temperature == temperature
        if temperature:  # greedy resets top_p and top_k anyway
            assert (params.top_p, params.top_k) == (1.0, 0)
        assert params.max_tokens == 4
    for params in _params(tmp_path, {"max_tokens": 50}):
        assert params.max_tokens == 10  # max_new_tokens is a server-wide limit, as upstream


def test_vllm_setting_keeps_vllm_defaults(tmp_path):
    for params in _params(tmp_path, {}, setting="vllm"):
        assert (params.temperature, params.top_p, params.top_k) == (1.0, 1.0, 0)
    chat_params, completion_params = _params(tmp_path, {}, setting="vllm")
    assert completion_params.max_tokens == 16 and chat_params.max_tokens > 16


def test_min_tokens_that_the_room_left_cannot_hold_is_a_400_naming_why(tmp_path):
    """A min_tokens above what max_tokens is clamped to (the server's max_new_tokens here, or
    what the prompt leaves of the context) is refused with that cause: the message quoted the
    clamped max_tokens, which the client never sent. A max_tokens the client sent below it keeps
    the sampling parameters' message."""
    chat, completion = _servers(tmp_path)  # max_new_tokens 10, max_model_len 4096
    messages = [{"role": "user", "content": "hi"}]
    for serving, body in ((completion, {"prompt": "hi"}), (chat, {"messages": messages})):
        request = CompletionRequest if serving is completion else ChatCompletionRequest
        with pytest.raises(OpenAIError) as error:
            serving._inputs(request.model_validate({**body, "min_tokens": 11}))
        assert (error.value.code, error.value.param) == (400, "min_tokens")
        assert str(error.value) == (
            "min_tokens (11) does not fit: the server generates at most 10 tokens a request"
        )
        serving._inputs(request.model_validate({**body, "min_tokens": 10}))
        with pytest.raises(OpenAIError, match=r"min_tokens \(5\) must be <= max_tokens \(3\)"):
            serving._inputs(request.model_validate({**body, "min_tokens": 5, "max_tokens": 3}))
    long = {"prompt": [5] * 4090, "min_tokens": 8, "max_tokens": None}  # null: the room left
    with pytest.raises(OpenAIError) as error:
        completion._inputs(CompletionRequest.model_validate(long))
    assert str(error.value) == (
        "min_tokens (8) does not fit: the prompt's 4090 tokens leave 6 of the model's maximum "
        "context length (4096 tokens)"
    )


def test_a_prompt_and_max_tokens_over_the_context_length_are_a_400(tmp_path):
    """As upstream's server: the prompt's tokens and max_tokens (chat: either field) together may
    not exceed max_model_len; up to it, max_tokens is taken as sent (capped only by the server's
    max_new_tokens, which the second server has not)."""
    chat, completion = _servers(tmp_path)  # max_model_len 4096
    (tmp_path / "plain").mkdir()
    plain_chat, plain = _servers(tmp_path / "plain", setting="vllm")
    prompt = [5] * 4090
    for max_tokens in (7, 4096):
        with pytest.raises(OpenAIError) as error:
            completion._inputs(
                CompletionRequest.model_validate({"prompt": prompt, "max_tokens": max_tokens})
            )
        assert (error.value.code, error.value.param) == (400, "max_tokens")
        total = 4090 + max_tokens
        assert str(error.value).startswith(
            f"This model's maximum context length is 4096 tokens. However, the request asks for "
            f"{total} tokens: 4090 in the prompt and {max_tokens} in the completion (max_tokens)."
        )
    with pytest.raises(OpenAIError, match="^This model's maximum context length is 4096"):
        completion._inputs(CompletionRequest.model_validate({"prompt": prompt}))  # 16 by default
    ((_, _, params),) = plain._inputs(
        CompletionRequest.model_validate({"prompt": prompt, "max_tokens": 6})
    )
    assert params.max_tokens == 6
    messages = [{"role": "user", "content": "hi " * 100}]
    n = len(plain_chat._inputs(ChatCompletionRequest.model_validate({"messages": messages}))[0])
    for field in ("max_tokens", "max_completion_tokens"):
        for serving in (chat, plain_chat):
            body = {"messages": messages, field: 4096 - n + 1}
            with pytest.raises(OpenAIError, match="maximum context length") as error:
                serving._inputs(ChatCompletionRequest.model_validate(body))
            assert error.value.param == field
        body = {"messages": messages, field: 4096 - n}
        assert plain_chat._inputs(ChatCompletionRequest.model_validate(body))[1].max_tokens == (
            4096 - n
        )
