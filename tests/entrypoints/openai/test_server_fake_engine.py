"""The HTTP layer in a real server process, over a scripted engine (so replies are known):
chat with the kimi_k3 reasoning parser (whole and streamed), the error shapes and fields, the
API key, and a client that disconnects mid-stream freeing its cache."""

import http.client
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import requests
from server_utils import RemoteServer

from vllm.model_executor.model_loader.builtin import resolve_model
from vllm.reasoning.kimi_k3_reasoning_parser import THINK_END, THINK_START
from vllm.transformers_utils.tokenizer import get_tokenizer

SCRIPT = f"Hmm.{THINK_START}Two and two make four.{THINK_END} The answer is 4."
KEY = "sk-test"


# Tokens that take a request 200 s at 5 ms a step: in the disconnect tests no request can end on
# its own, so one that left the engine was aborted, however slowly the disconnect got there.
LONG = 40_000


def _fake_server(*flags: str) -> RemoteServer:
    script = str(Path(__file__).parent / "fake_server.py")
    command = [sys.executable, script, "0", SCRIPT, "--step-delay", "0.005", *flags]
    return RemoteServer(command=command, timeout=60)


@pytest.fixture(scope="module")
def server():
    with _fake_server("--reasoning-parser", "kimi_k3", "--api-key", KEY) as remote:
        yield remote


@pytest.fixture(scope="module")
def details_server():
    with _fake_server("--enable-prompt-tokens-details") as remote:
        yield remote


@pytest.fixture(scope="module")
def long_server():
    # A slow abort: the aborted request leaves the engine well after the client went away.
    with _fake_server("--max-model-len", str(LONG + 100), "--abort-delay", "1.5") as remote:
        yield remote


def _post(server: RemoteServer, path: str, body: dict, key: str | None = KEY, **kw):
    headers = {"Authorization": f"Bearer {key}"} if key is not None else {}
    kw.setdefault("timeout", 30)
    return requests.post(server.url(path), json=body, headers=headers, **kw)


def _events(response: requests.Response) -> list:
    events = []
    for line in response.iter_lines():
        if line:
            assert line.startswith(b"data: "), line
            data = line[len(b"data: ") :]
            events.append(data.decode() if data == b"[DONE]" else json.loads(data))
    return events


def test_chat_splits_reasoning(server: RemoteServer) -> None:
    body = {"model": "fake-alias", "messages": [{"role": "user", "content": "2+2?"}],
            "max_tokens": len(SCRIPT)}  # fmt: skip
    reply = _post(server, "/v1/chat/completions", body).json()
    message = reply["choices"][0]["message"]
    assert message["reasoning"] == "Two and two make four."
    assert message["content"] == "Hmm. The answer is 4."
    assert reply["model"] == "fake"  # the first served name
    usage = reply["usage"]
    assert usage["completion_tokens"] == len(SCRIPT)  # one byte-level token per character
    assert usage["total_tokens"] == usage["prompt_tokens"] + len(SCRIPT) > len(SCRIPT)


def test_streamed_chat_deltas_add_up(server: RemoteServer) -> None:
    body = {"messages": [{"role": "user", "content": "2+2?"}], "max_tokens": len(SCRIPT),
            "stream": True, "stream_options": {"include_usage": True}}  # fmt: skip
    events = _events(_post(server, "/v1/chat/completions", body, stream=True))
    assert events[-1] == "[DONE]"
    assert events[0]["choices"][0]["delta"]["role"] == "assistant"
    assert events[-2]["choices"] == [] and events[-2]["usage"]["completion_tokens"] > 0
    deltas = [e["choices"][0]["delta"] for e in events[1:-2]]
    assert "".join(d.get("reasoning", "") for d in deltas) == "Two and two make four."
    assert "".join(d.get("content", "") for d in deltas) == "Hmm. The answer is 4."
    assert events[-3]["choices"][0]["finish_reason"] == "length"
    assert len(deltas) > 5  # really streamed


@pytest.mark.parametrize("stop", ["four", "Hmm."])
def test_streamed_and_whole_agree_at_a_stop_string(server: RemoteServer, stop: str) -> None:
    """The scripted engine streamed text the real one holds back (a possible start of a stop
    string): streamed reasoning "Two and two make fou", whole "Two and two make "."""
    fields = {"messages": [{"role": "user", "content": "2+2?"}], "max_tokens": len(SCRIPT),
              "stop": [stop]}  # fmt: skip
    whole = _post(server, "/v1/chat/completions", fields).json()["choices"][0]["message"]
    events = _events(_post(server, "/v1/chat/completions", {**fields, "stream": True}, stream=True))
    deltas = [e["choices"][0]["delta"] for e in events[:-1] if e["choices"]]
    for part in ("reasoning", "content"):
        streamed = "".join(d.get(part) or "" for d in deltas)
        assert streamed == (whole.get(part) or ""), (part, streamed, whole)


def test_streamed_chat_chunks_carry_only_what_is_set(server: RemoteServer) -> None:
    """As upstream's chat stream (`model_dump_json(exclude_unset=True)`): a delta holds only its
    own fields (no `"content": null` beside reasoning, no `role` after the first chunk), each
    choice `index`, `delta`, `logprobs` and `finish_reason`, with `stop_reason` in the last only,
    no `usage` unless asked for, and every chunk the same `created`."""
    body = {"messages": [{"role": "user", "content": "2+2?"}], "max_tokens": len(SCRIPT),
            "stream": True, "stream_options": {"include_usage": True}}  # fmt: skip
    events = _events(_post(server, "/v1/chat/completions", body, stream=True))[:-1]
    top = {"id", "object", "created", "model", "choices"}
    assert all(set(e) == top for e in events[:-1]), events
    assert set(events[-1]) == top | {"usage"} and events[-1]["choices"] == []
    assert len({e["created"] for e in events}) == 1 and len({e["id"] for e in events}) == 1
    choices = [e["choices"][0] for e in events[:-1]]
    assert choices[0] == {"index": 0, "delta": {"role": "assistant", "content": ""},
                          "logprobs": None, "finish_reason": None}  # fmt: skip
    base = {"index", "delta", "logprobs", "finish_reason"}
    assert all(set(c) == base for c in choices[1:-1]), choices
    assert set(choices[-1]) == base | {"stop_reason"} and choices[-1]["finish_reason"] == "length"
    deltas = [c["delta"] for c in choices[1:]]
    assert all(set(d) <= {"content", "reasoning"} and None not in d.values() for d in deltas)
    assert any(set(d) == {"reasoning"} for d in deltas), deltas  # reasoning alone, no content


@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions"])
def test_a_stream_longer_than_a_second_keeps_one_created(long_server: RemoteServer, path) -> None:
    """Every chunk of a stream carries the request's `created`, as upstream and OpenAI; the
    completions stream stamped each chunk with its own time. 300 steps of 5 ms: the stream spans
    a change of the clock's second."""
    fields = (
        {"prompt": "2+2?"}
        if path == "/v1/completions"
        else {"messages": [{"role": "user", "content": "2+2?"}]}
    )
    body = {**fields, "max_tokens": 300, "stream": True,
            "stream_options": {"include_usage": True}}  # fmt: skip
    start = time.time()
    events = _events(_post(long_server, path, body, key=None, stream=True))[:-1]
    assert time.time() - start > 1.0 and len(events) > 100
    assert {e["created"] for e in events} == {events[0]["created"]}
    assert int(start) <= events[0]["created"] <= int(time.time())


def test_chat_continues_the_final_message_inside_its_think_block(server: RemoteServer) -> None:
    """The final assistant message opened a think block and is continued: the prompt ends with
    its text (no end of turn after it) and the reply goes on reasoning until it closes the block
    (the marker that the scripted reply opens on the way is reasoning's text)."""
    prefill = f"{THINK_START}Hm"
    fields = {"messages": [{"role": "user", "content": "q"},
                           {"role": "assistant", "content": prefill}],
              "add_generation_prompt": False, "continue_final_message": True}  # fmt: skip
    tokens = _post(server, "/tokenize", fields).json()["tokens"]
    prompt = _post(server, "/detokenize", {"tokens": tokens}).json()["prompt"]
    assert prompt.endswith("<|eos|>\nassistant: " + prefill), prompt
    reply = _post(server, "/v1/chat/completions", {**fields, "max_tokens": len(SCRIPT)}).json()
    assert reply["usage"] == {"prompt_tokens": len(tokens), "completion_tokens": len(SCRIPT),
                              "total_tokens": len(tokens) + len(SCRIPT),
                              "prompt_tokens_details": None}  # fmt: skip
    message = reply["choices"][0]["message"]
    assert message["reasoning"] == f"Hmm.{THINK_START}Two and two make four."
    assert message["content"] == " The answer is 4."


def test_chat_continues_a_final_user_message_in_the_users_role(server: RemoteServer) -> None:
    """As upstream: a final user message is continued too, and the reply, the rest of the user's
    text, has the user's role (whole, and in the stream's first chunk). A think block the user's
    text left open is not the reply's reasoning: the reply starts as content."""
    fields = {"messages": [{"role": "user", "content": f"{THINK_START}Complete th"}],
              "add_generation_prompt": False, "continue_final_message": True,
              "max_tokens": len(SCRIPT)}  # fmt: skip
    tokens = _post(server, "/tokenize", fields).json()["tokens"]
    prompt = _post(server, "/detokenize", {"tokens": tokens}).json()["prompt"]
    assert prompt.endswith(f"user: {THINK_START}Complete th"), prompt
    message = _post(server, "/v1/chat/completions", fields).json()["choices"][0]["message"]
    assert message == {"role": "user", "content": "Hmm. The answer is 4.",
                       "reasoning": "Two and two make four."}  # fmt: skip
    events = _events(_post(server, "/v1/chat/completions", {**fields, "stream": True}, stream=True))
    assert events[0]["choices"][0]["delta"] == {"role": "user", "content": ""}
    deltas = [e["choices"][0]["delta"] for e in events[1:-1]]
    assert "".join(d.get("content", "") for d in deltas) == message["content"]
    # Set through chat_template_kwargs, as upstream lets them set it: the same role.
    kwargs = {"add_generation_prompt": False, "continue_final_message": True}
    body = {"messages": fields["messages"], "chat_template_kwargs": kwargs, "max_tokens": 3}
    reply = _post(server, "/v1/chat/completions", body).json()
    assert reply["choices"][0]["message"]["role"] == "user"
    # Continuing an assistant's message, or none, answers as the assistant.
    answer = [*fields["messages"], {"role": "assistant", "content": "It"}]
    body = {**fields, "messages": answer, "max_tokens": 3}
    assert _post(server, "/v1/chat/completions", body).json()["choices"][0]["message"]["role"] == (
        "assistant"
    )
    # Without a generation prompt, a closed final message's role too, as upstream names it.
    body = {**fields, "continue_final_message": False, "max_tokens": 3}
    assert _post(server, "/v1/chat/completions", body).json()["choices"][0]["message"]["role"] == (
        "user"
    )


def test_a_reply_that_is_all_reasoning_has_null_content(server: RemoteServer) -> None:
    """As upstream's reasoning parsers (the content after the think block, `or None`): a reply
    the parser takes whole, here one that stops inside the block the final message opened, has
    `content: null`, not `""`."""
    fields = {"messages": [{"role": "user", "content": "q"},
                           {"role": "assistant", "content": THINK_START}],
              "add_generation_prompt": False, "continue_final_message": True,
              "max_tokens": SCRIPT.index(THINK_END)}  # fmt: skip
    message = _post(server, "/v1/chat/completions", fields).json()["choices"][0]["message"]
    assert message["reasoning"] == SCRIPT[: SCRIPT.index(THINK_END)]
    assert message["content"] is None, message


@pytest.mark.parametrize(
    "body, param",
    [
        ({"prompt": "hi", "max_tokens": "many"}, "max_tokens"),
        ({"prompt": "hi", "temperature": -0.5}, "temperature"),
        ({"prompt": "hi", "top_p": 1.5}, "top_p"),
        ({"prompt": "hi", "n": 0}, "n"),
        ({"prompt": "hi", "n": 129}, "n"),  # over MAX_N
        ({"prompt": "hi", "max_tokens": 129}, "max_tokens"),
        ({"prompt": "x" * 200}, "prompt"),
        ({"prompt": [1, 2, 100000]}, "prompt"),
        ({"prompt": 5}, "prompt"),
        ({"prompt": "hi", "stop": [""]}, "stop"),
        ({"prompt": "hi", "logprobs": -1}, "logprobs"),
        ({"max_tokens": 3}, "prompt"),
        # Values the engine's generators or float32 sampling cannot hold (each stopped the
        # engine for every client before it was refused here).
        ({"prompt": "hi", "seed": 2**64}, "seed"),
        ({"prompt": "hi", "seed": 2**64 - 1, "n": 2}, "seed"),  # completion 1 would use 2**64
        ({"prompt": "hi", "repetition_penalty": 1e-300}, "repetition_penalty"),
        ({"prompt": "hi", "repetition_penalty": 1e300}, "repetition_penalty"),
        ({"prompt": "hi", "temperature": 1e300}, "temperature"),
        ({"prompt": "\ud800 x"}, "prompt"),  # a lone surrogate: no UTF-8 for it
        # Sampling knobs the engine lacks: refused, not silently ignored as unknown fields are.
        ({"prompt": "hi", "presence_penalty": 0.5}, "presence_penalty"),
        ({"prompt": "hi", "frequency_penalty": -1.0}, "frequency_penalty"),
        ({"prompt": "hi", "logit_bias": {"7": 0, "5": 100}}, "logit_bias"),
        ({"prompt": "hi", "logit_bias": {"abc": 0}}, "logit_bias"),  # no token id (was a 200)
        ({"prompt": "hi", "response_format": {"type": "json_object"}}, "response_format"),
        ({"prompt": "hi", "stream_options": {"include_usage": True}}, "stream_options"),
        ({"prompt": "hi", "best_of": 2}, "best_of"),
        # vLLM's own request fields that this server does not implement (unknown ones are only
        # logged): refused by name, not answered as if absent.
        ({"prompt": "hi", "allowed_token_ids": [64]}, "allowed_token_ids"),
        ({"prompt": "hi", "prompt_logprobs": 1}, "prompt_logprobs"),
        # A count of alternatives: -1 (SamplingParams' whole vocabulary) is chat's, as upstream.
        ({"prompt": "hi", "logprobs": -1}, "logprobs"),
        ({"prompt": "hi", "guided_json": {"type": "object"}}, "guided_json"),
        # vLLM's range: -1 or a count of tokens (0 would keep none), at most max_model_len.
        ({"prompt": "hi", "truncate_prompt_tokens": 0}, "truncate_prompt_tokens"),
        ({"prompt": "hi", "truncate_prompt_tokens": -2}, "truncate_prompt_tokens"),
        ({"prompt": "hi", "truncate_prompt_tokens": 129}, "truncate_prompt_tokens"),
        ({"prompt": "hi", "truncate_prompt_tokens": "many"}, "truncate_prompt_tokens"),
    ],
)
def test_bad_completion_fields_are_400s_naming_them(
    server: RemoteServer, body: dict, param: str
) -> None:
    response = _post(server, "/v1/completions", body)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == param and error["code"] == 400, error
    assert error["type"] == "BadRequestError" and error["message"]


@pytest.mark.parametrize(
    "prompt, message",
    [
        ([], "prompt must not be empty"),
        ([[]], "prompt is empty"),
        ([[1, 2], []], "prompt is empty"),
        ("", "prompt is empty"),
        (["hi", ""], "prompt is empty"),
    ],
)
def test_an_empty_prompt_or_prompt_list_is_a_400(
    server: RemoteServer, prompt: list, message: str
) -> None:
    """No prompt to complete: a 400 naming `prompt` (as upstream for "", and as its open fix
    for `[]`: vllm-project/vllm#55391), not a 200 with no choices. The number of prompts is
    not capped otherwise, as upstream's is not."""
    response = _post(server, "/v1/completions", {"prompt": prompt, "max_tokens": 2})
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == "prompt" and error["message"] == message, error


@pytest.mark.parametrize(
    "prompt, message",
    [
        (["hi", 1], "item 0 is a string, item 1 a token id"),
        ([[1], "hi"], "item 0 is a list, item 1 a string"),
        ([[1], [2, "x"]], "item 1.1: Input should be a valid integer"),
    ],
)
def test_a_prompt_list_is_told_what_is_wrong_in_its_own_form(
    server: RemoteServer, prompt: list, message: str
) -> None:
    """Not pydantic's first-tried form's complaint (that "hi" is no valid integer)."""
    response = _post(server, "/v1/completions", {"prompt": prompt, "max_tokens": 2})
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == "prompt" and message in error["message"], error
    assert "list[" not in error["message"], error


def test_truncate_prompt_tokens_runs_the_last_tokens_and_reports_them(server: RemoteServer) -> None:
    """vLLM's extra field: only the last k prompt tokens run, truncated before the length
    checks (a prompt too long for the model runs once cut to fit); the usage counts, and echo
    shows, the prompt that ran."""
    tokenizer = get_tokenizer(resolve_model("kimi-k3-tiny")[0])
    long = "x" * 200
    assert _post(server, "/v1/completions", {"prompt": long}).status_code == 400
    ids = list(range(1, 201))
    for prompt, kept in ((long, tokenizer.encode(long)[-10:]), (ids, ids[-10:])):
        body = {"prompt": prompt, "max_tokens": 3, "echo": True, "truncate_prompt_tokens": 10}
        response = _post(server, "/v1/completions", body)
        assert response.status_code == 200, response.text
        reply = response.json()
        assert reply["usage"]["prompt_tokens"] == 10
        echoed = tokenizer.decode(kept, skip_special_tokens=False)
        assert reply["choices"][0]["text"] == echoed + SCRIPT[:3]
        stream = {**body, "stream": True, "stream_options": {"include_usage": True}}
        events = _events(_post(server, "/v1/completions", stream, stream=True))
        assert "".join(e["choices"][0]["text"] for e in events[:-2]) == echoed + SCRIPT[:3]
        assert events[-2]["usage"]["prompt_tokens"] == 10
    # -1 keeps the last max_model_len (128) tokens, checked once truncated: they leave no room.
    body = {"prompt": long, "truncate_prompt_tokens": -1}
    error = _post(server, "/v1/completions", body).json()["error"]
    assert error["param"] == "prompt" and "has 128 input tokens" in error["message"], error
    # A prompt no longer than k runs whole; so does a prompt within max_model_len at -1.
    for value in (100, -1):
        body = {"prompt": "hi", "max_tokens": 2, "echo": True, "truncate_prompt_tokens": value}
        assert _post(server, "/v1/completions", body).json()["choices"][0]["text"].startswith("hi")
    # Chat cuts its rendered conversation the same way.
    chat = {"messages": [{"role": "user", "content": long}], "max_tokens": 2}
    assert _post(server, "/v1/chat/completions", chat).status_code == 400
    response = _post(server, "/v1/chat/completions", {**chat, "truncate_prompt_tokens": 20})
    assert response.status_code == 200, response.text
    assert response.json()["usage"]["prompt_tokens"] == 20


def test_neutral_values_of_the_knobs_the_engine_lacks_are_accepted(server: RemoteServer) -> None:
    body = {"prompt": "hi", "max_tokens": 2, "presence_penalty": 0, "frequency_penalty": 0.0,
            "logit_bias": {"5": 0}, "use_beam_search": False, "bad_words": [],
            "prompt_logprobs": None}  # fmt: skip
    response = _post(server, "/v1/completions", body)
    assert response.status_code == 200, response.text
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
    for tool_choice in ("none", "auto", None):
        body = {"messages": USER, "max_tokens": 2, "tools": tools, "tool_choice": tool_choice}
        response = _post(server, "/v1/chat/completions", body)
        assert response.status_code == 200, response.text
    for n, best_of in ((1, None), (1, 1), (2, 2)):
        body = {"prompt": "hi", "max_tokens": 2, "n": n, "best_of": best_of}
        response = _post(server, "/v1/completions", body)
        assert response.status_code == 200, response.text


def test_only_unknown_fields_are_logged_as_ignored(server: RemoteServer) -> None:
    """An unknown field is taken with a warning naming it; a refused field at its neutral value
    is checked by the request's handler, so the warning does not call it ignored."""
    body = {"prompt": "hi", "max_tokens": 2, "not_a_field_1": 1, "allowed_token_ids": None,
            "priority": 0}  # fmt: skip
    response = _post(server, "/v1/completions", body)
    assert response.status_code == 200, response.text
    body = {"messages": USER, "max_tokens": 2, "not_a_field_2": True, "tool_choice": "auto"}
    assert _post(server, "/v1/chat/completions", body).status_code == 200
    lines = [line for line in server.output().splitlines() if "ignoring unknown fields" in line]
    lines = [line for line in lines if "not_a_field_" in line]  # this test's requests only
    assert any("/v1/completions: ignoring unknown fields ['not_a_field_1']" in x for x in lines)
    chat = "/v1/chat/completions: ignoring unknown fields ['not_a_field_2']"
    assert any(chat in x for x in lines)
    assert not any("allowed_token_ids" in x or "priority" in x or "tool_choice" in x for x in lines)


USER = [{"role": "user", "content": "hi"}]
ANSWER = [*USER, {"role": "assistant", "content": "It is"}]


@pytest.mark.parametrize(
    "path, body, param",
    [
        ("/v1/chat/completions", {}, "messages"),
        ("/v1/chat/completions", {"messages": []}, "messages"),
        ("/v1/chat/completions", {"messages": [{"content": "hi"}]}, "messages"),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x" * 200}]},
         "messages"),
        ("/v1/chat/completions", {"messages": USER, "max_tokens": 129}, "max_tokens"),
        ("/v1/chat/completions", {"messages": USER, "max_completion_tokens": "x"},
         "max_completion_tokens"),
        # Checked as max_tokens, but named as sent: the field that newer OpenAI clients send.
        ("/v1/chat/completions", {"messages": USER, "max_completion_tokens": 129},
         "max_completion_tokens"),
        ("/v1/chat/completions", {"messages": USER, "max_completion_tokens": -1},
         "max_completion_tokens"),
        ("/v1/chat/completions", {"messages": USER, "max_tokens": -1}, "max_tokens"),
        ("/v1/chat/completions", {"messages": USER, "temperature": -1}, "temperature"),
        ("/v1/chat/completions",
         {"messages": USER, "stream": False, "stream_options": {"include_usage": True}},
         "stream_options"),
        ("/v1/chat/completions", {"messages": USER, "top_logprobs": 2}, "top_logprobs"),
        ("/v1/chat/completions", {"messages": USER, "logprobs": True, "top_logprobs": -1},
         "top_logprobs"),  # the whole vocabulary: over max_logprobs (20)
        ("/v1/chat/completions", {"messages": USER, "logprobs": True, "top_logprobs": -2},
         "top_logprobs"),
        ("/v1/chat/completions", {"messages": USER, "logprobs": True, "top_logprobs": 321},
         "top_logprobs"),  # over the fake engine's vocabulary of 320
        ("/v1/chat/completions", {"messages": USER, "logprobs": True, "top_logprobs": 21},
         "top_logprobs"),  # over its max_logprobs of 20
        ("/v1/chat/completions", {"messages": USER, "n": "two"}, "n"),
        ("/v1/chat/completions", {"messages": USER, "n": 129}, "n"),
        ("/v1/chat/completions", {"messages": USER, "logit_bias": {"65": 5}}, "logit_bias"),
        ("/v1/chat/completions", {"messages": USER, "logit_bias": []}, "logit_bias"),
        ("/v1/chat/completions", {"messages": USER, "tool_choice": "required"}, "tool_choice"),
        ("/v1/chat/completions", {"messages": USER, "bad_words": ["g"]}, "bad_words"),
        ("/v1/chat/completions",
         {"messages": USER, "response_format": {"type": "json_schema", "json_schema": {}}},
         "response_format"),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "\ud800"}]},
         "messages"),
        ("/v1/chat/completions", {"messages": USER, "chat_template_kwargs": {"tokenize": True}},
         "chat_template_kwargs"),
        ("/v1/chat/completions",
         {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]},
         "messages"),  # the template skipped the image: answered as an empty message
        # A final message is never continued after a generation prompt (true unless set to
        # false), which would open a new turn after it.
        ("/v1/chat/completions", {"messages": ANSWER, "continue_final_message": True},
         "continue_final_message"),
        ("/v1/chat/completions",
         {"messages": ANSWER, "chat_template_kwargs": {"continue_final_message": True}},
         "continue_final_message"),
        ("/tokenize", {"messages": ANSWER, "continue_final_message": True},
         "continue_final_message"),
        # A request's own template, on a server that does not trust them (the default).
        ("/v1/chat/completions", {"messages": USER, "chat_template": "{{ messages }}"},
         "chat_template"),
        ("/tokenize", {"messages": USER, "chat_template": "{{ messages }}"}, "chat_template"),
        ("/tokenize", {"messages": USER, "chat_template_kwargs": {"chat_template": "x"}},
         "chat_template_kwargs"),
        ("/tokenize", {}, "prompt"),
        # The template adds the eos text to a string: a TypeError, which was a 500.
        ("/tokenize", {"messages": USER, "chat_template_kwargs": {"eos_token": {"a": 1}}},
         "messages"),
        ("/v1/chat/completions",
         {"messages": USER, "chat_template_kwargs": {"eos_token": {"a": 1}}}, "messages"),
        ("/tokenize", {"messages": []}, "messages"),  # was a 500
        ("/tokenize", {"prompt": 3}, "prompt"),
        ("/tokenize", {"prompt": "\ud800"}, "prompt"),
        ("/tokenize", {"messages": USER, "chat_template_kwargs": {"messages": []}},
         "chat_template_kwargs"),
        ("/detokenize", {"tokens": [1, 100000]}, "tokens"),
        ("/detokenize", {"tokens": "abc"}, "tokens"),
        # Not tools of vLLM's (and OpenAI's) schema, a function with a name: each was a 200,
        # the template given whatever came.
        ("/v1/chat/completions", {"messages": USER, "tools": [{}]}, "tools"),
        ("/v1/chat/completions",
         {"messages": USER, "tools": [{"type": "web", "function": {"name": "f"}}]}, "tools"),
        ("/tokenize", {"messages": USER, "tools": [{"type": "function", "function": {}}]},
         "tools"),
        ("/v1/chat/completions", {"messages": USER, "truncate_prompt_tokens": 0},
         "truncate_prompt_tokens"),
        ("/v1/chat/completions", {"messages": USER, "truncate_prompt_tokens": 129},
         "truncate_prompt_tokens"),
    ],
)  # fmt: skip
def test_bad_chat_and_tokenizer_fields_are_400s_naming_them(
    server: RemoteServer, path: str, body: dict, param: str
) -> None:
    response = _post(server, path, body)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert (error["param"], error["code"], error["type"]) == (param, 400, "BadRequestError"), error


@pytest.mark.parametrize("path", ["/v1/completions", "/detokenize"])
@pytest.mark.parametrize(
    "body",
    [
        b"{oops",
        b'{"prompt": ' + b"[" * 100_000 + b"]" * 100_000 + b"}",
        # Over Python's limit on the digits of an int read from text: a bare ValueError (500).
        b'{"prompt": [' + b"9" * 5000 + b'], "tokens": [' + b"9" * 5000 + b"]}",
    ],
    ids=["bad", "deep", "long_int"],
)
def test_a_body_that_is_not_json_is_a_400(server: RemoteServer, path: str, body: bytes) -> None:
    response = requests.post(
        server.url(path), data=body, timeout=10,
        headers={"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"},
    )  # fmt: skip
    assert response.status_code == 400, response.text
    assert "not valid JSON" in response.json()["error"]["message"]


def test_chat_template_kwargs_override_add_generation_prompt(server: RemoteServer) -> None:
    """As upstream: `chat_template_kwargs` win over the request's own `add_generation_prompt`."""

    def count(**extra) -> int:
        response = _post(server, "/tokenize", {"messages": USER, **extra})
        assert response.status_code == 200, response.text
        return response.json()["count"]

    without = count(add_generation_prompt=False)
    assert count(chat_template_kwargs={"add_generation_prompt": False}) == without
    assert count() > without
    # Template variables may also replace the special tokens' texts, as HF's do.
    assert count(chat_template_kwargs={"pad_token": "<pad>"}) == count()


def test_an_error_quoting_a_lone_surrogate_is_still_json(server: RemoteServer) -> None:
    response = _post(server, "/v1/completions", {"prompt": "hi", "model": "m\ud800"})
    assert response.status_code == 404, response.text
    assert "m\\ud800" in response.json()["error"]["message"]


@pytest.mark.parametrize(
    "path, body",
    [
        ("/v1/completions", {"prompt": "hi", "model": "gpt-9"}),
        ("/v1/chat/completions", {"messages": USER, "model": "gpt-9"}),
        ("/tokenize", {"prompt": "hi", "model": "gpt-9"}),
        ("/detokenize", {"tokens": [1], "model": "gpt-9"}),
    ],
)
def test_unknown_model_is_404(server: RemoteServer, path: str, body: dict) -> None:
    response = _post(server, path, body)
    assert response.status_code == 404
    error = response.json()["error"]
    assert error["message"] == "The model `gpt-9` does not exist."
    assert (error["type"], error["param"], error["code"]) == ("NotFoundError", "model", 404)


def test_api_key_guards_v1_only(server: RemoteServer) -> None:
    response = _post(server, "/v1/completions", {"prompt": "hi"}, key=None)
    assert response.status_code == 401
    assert response.json()["error"]["code"] == 401
    assert _post(server, "/v1/completions", {"prompt": "hi"}, key="wrong").status_code == 401
    assert _post(server, "/v1/chat/completions", {"messages": USER}, key=None).status_code == 401
    assert requests.get(server.url("/v1/models"), timeout=10).status_code == 401
    assert _post(server, "/v1/completions", {"prompt": "hi"}).status_code == 200
    assert _post(server, "/tokenize", {"prompt": "hi"}, key=None).status_code == 200


def _metric(server: RemoteServer, name: str) -> float:
    for line in requests.get(server.url("/metrics"), timeout=10).text.splitlines():
        if line.startswith(name + "{"):
            return float(line.rsplit(" ", 1)[1])
    raise KeyError(name)


def _wait_for_metrics(
    server: RemoteServer, condition: Callable[[dict[str, float]], bool], timeout: float = 30.0
) -> None:
    """Poll /metrics until `condition` holds for one reading (the gauges of one reading may
    straddle an engine iteration, a later one catches up)."""
    deadline = time.monotonic() + timeout
    while True:
        text = requests.get(server.url("/metrics"), timeout=10).text
        metrics = {
            line.split("{", 1)[0]: float(line.rsplit(" ", 1)[1])
            for line in text.splitlines()
            if line.startswith("vllm:")
        }
        if condition(metrics):
            return
        assert time.monotonic() < deadline, metrics
        time.sleep(0.05)


def _idle_and_freed(metrics: dict[str, float]) -> bool:
    return (
        metrics["vllm:num_requests_running"] == 0
        and metrics["vllm:num_free_blocks"] == metrics["vllm:initial_num_free_blocks"]
        and metrics["vllm:num_free_kda_slots"] == metrics["vllm:initial_num_free_kda_slots"]
    )


def test_disconnect_mid_stream_aborts_and_frees(long_server: RemoteServer) -> None:
    server = long_server
    body = {"prompt": "hi", "max_tokens": LONG, "stream": True}
    generated = _metric(server, "vllm:generation_tokens_total")
    with _post(server, "/v1/completions", body, stream=True) as response:
        lines = response.iter_lines()
        next(line for line in lines if line)
        assert _metric(server, "vllm:num_requests_running") == 1
    _wait_for_metrics(server, _idle_and_freed)
    assert _metric(server, "vllm:generation_tokens_total") - generated < LONG


def test_disconnect_while_waiting_for_a_whole_response_aborts(long_server: RemoteServer) -> None:
    server = long_server
    generated = _metric(server, "vllm:generation_tokens_total")
    connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
    body = json.dumps({"prompt": "hi", "max_tokens": LONG})
    connection.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
    # Hang up only once the request runs: before, the disconnect could not abort anything.
    _wait_for_metrics(server, lambda metrics: metrics["vllm:num_requests_running"] == 1)
    connection.close()
    _wait_for_metrics(server, _idle_and_freed)
    assert _metric(server, "vllm:generation_tokens_total") - generated < LONG


def test_streamed_completion_with_echo_and_logprobs_adds_up(server: RemoteServer) -> None:
    body = {"prompt": ["ab", "xyz"], "max_tokens": 6, "stream": True, "echo": True,
            "logprobs": 1, "n": 2}  # fmt: skip
    events = _events(_post(server, "/v1/completions", body, stream=True))
    assert events[-1] == "[DONE]"
    texts: dict[int, str] = {}
    tokens: dict[int, list[str]] = {}
    offsets: dict[int, list[int]] = {}
    for event in events[:-1]:
        (choice,) = event["choices"]
        i = choice["index"]
        texts[i] = texts.get(i, "") + choice["text"]
        tokens.setdefault(i, []).extend(choice["logprobs"]["tokens"])
        offsets.setdefault(i, []).extend(choice["logprobs"]["text_offset"])
    reply = SCRIPT[:6]
    assert texts == {0: "ab" + reply, 1: "ab" + reply, 2: "xyz" + reply, 3: "xyz" + reply}
    for i, text in texts.items():
        assert "".join(tokens[i]) == text
        assert offsets[i] == list(range(len(text)))  # one character per token here


def test_null_optional_fields_mean_their_defaults(server: RemoteServer) -> None:
    """The OpenAI reference types `n`, `stream`, `echo`, chat `logprobs`... as "X or null"; some
    clients send every field, null where unset. Null is the default, except where null has a
    meaning of its own (completions' `max_tokens`: no limit)."""
    nulls = {"n": None, "stream": None, "ignore_eos": None, "min_tokens": None,
             "logit_bias": {}, "response_format": {"type": "text"},  # nothing to refuse
             "include_stop_str_in_output": None, "skip_special_tokens": None,
             "temperature": None, "stop": None, "seed": None, "stream_options": None}  # fmt: skip
    body = {"prompt": "hi", "echo": None, "logprobs": None, "add_special_tokens": None, **nulls}
    response = _post(server, "/v1/completions", {**body, "max_tokens": 3})
    assert response.status_code == 200, response.text
    reply = response.json()
    assert [c["text"] for c in reply["choices"]] == [SCRIPT[:3]]  # n 1, no echo, not streamed
    assert reply["choices"][0]["logprobs"] is None
    unlimited = _post(server, "/v1/completions", {**body, "max_tokens": None}).json()
    assert unlimited["usage"]["completion_tokens"] == 128 - unlimited["usage"]["prompt_tokens"]
    chat = {"messages": USER, "logprobs": None, "top_logprobs": None, "max_tokens": 3,
            "add_generation_prompt": None, "include_reasoning": None, **nulls}  # fmt: skip
    response = _post(server, "/v1/chat/completions", chat)
    assert response.status_code == 200, response.text
    (choice,) = response.json()["choices"]
    assert choice["logprobs"] is None and choice["finish_reason"] == "length"
    assert choice["message"]["reasoning"] is None and choice["message"]["content"] == SCRIPT[:3]


@pytest.mark.parametrize(
    "path, body",
    [
        ("/v1/completions", {"prompt": ["ab", "xyz"], "n": 2, "echo": True}),
        ("/v1/chat/completions", {"messages": USER, "n": 2}),
    ],
)
def test_continuous_usage_stats_put_the_usage_so_far_in_every_chunk(
    server: RemoteServer, path: str, body: dict
) -> None:
    options = {"include_usage": True, "continuous_usage_stats": True}
    body = {**body, "max_tokens": 5, "stream": True, "stream_options": options}
    events = _events(_post(server, path, body, stream=True))
    assert events[-1] == "[DONE]" and events[-2]["choices"] == []
    final = events[-2]["usage"]
    assert final["completion_tokens"] == (4 * 5 if "prompt" in body else 2 * 5)
    usages = [e["usage"] for e in events[:-2]]
    assert all(u is not None for u in usages), usages
    assert {u["prompt_tokens"] for u in usages} == {final["prompt_tokens"]}
    counts = [u["completion_tokens"] for u in usages]
    assert counts == sorted(counts) and counts[-1] == final["completion_tokens"]
    assert all(u["total_tokens"] == u["prompt_tokens"] + u["completion_tokens"] for u in usages)
    # Without continuous_usage_stats the chunks carry none, as before: as upstream, a chat chunk
    # leaves the field out, a completion chunk has it null.
    body["stream_options"] = {"include_usage": True}
    events = _events(_post(server, path, body, stream=True))
    assert all(("usage" in e) == ("prompt" in body) for e in events[:-2]), events
    assert all(e.get("usage") is None for e in events[:-2])


@pytest.mark.parametrize(
    "path, body",
    [
        ("/v1/completions", {"prompt": ["ab", "xyz"], "n": 2}),
        ("/v1/chat/completions", {"messages": USER, "n": 2}),
    ],
)
@pytest.mark.parametrize("enabled", [False, True])
def test_prompt_tokens_details_only_with_the_flag(
    server: RemoteServer, details_server: RemoteServer, path: str, body: dict, enabled: bool
) -> None:
    """As vLLM: with `--enable-prompt-tokens-details` a reply's usage, and a stream's final
    usage chunk, have `prompt_tokens_details.cached_tokens` (0: there is no prefix cache);
    without it the field is null in a reply and left out of the final chunk. The usage of the
    other chunks (`continuous_usage_stats`) never has it: left out of a chat chunk, null in a
    completion chunk, which keeps every field."""
    remote, key = (details_server, None) if enabled else (server, KEY)
    expected = {"cached_tokens": 0} if enabled else None
    body = {**body, "max_tokens": 3}
    usage = _post(remote, path, body, key=key).json()["usage"]
    assert usage["prompt_tokens_details"] == expected
    options = {"include_usage": True, "continuous_usage_stats": True}
    stream = {**body, "stream": True, "stream_options": options}
    events = _events(_post(remote, path, stream, key=key, stream=True))
    assert events[-1] == "[DONE]" and events[-2]["choices"] == []
    final = events[-2]["usage"]
    assert {k: v for k, v in final.items() if k != "prompt_tokens_details"} == {
        k: v for k, v in usage.items() if k != "prompt_tokens_details"
    }
    assert final.get("prompt_tokens_details", "left out") == (expected or "left out")
    chunks = [e["usage"] for e in events[:-2]]
    assert chunks and all(u["total_tokens"] > 0 for u in chunks)
    if "prompt" in body:
        assert all(u["prompt_tokens_details"] is None for u in chunks), chunks
    else:
        assert all("prompt_tokens_details" not in u for u in chunks), chunks


def test_retrieve_model_answers_each_served_name(server: RemoteServer) -> None:
    """OpenAI's `GET /v1/models/{model}`: the card that `/v1/models` lists under that name, and
    a 404 naming any other (it was a route-not-found 404). A second later too: the card's
    `created` is the server's, not the request's."""
    headers = {"Authorization": f"Bearer {KEY}"}
    listed = requests.get(server.url("/v1/models"), headers=headers, timeout=10).json()["data"]
    time.sleep(1.05)
    for card in listed:
        response = requests.get(server.url(f"/v1/models/{card['id']}"), headers=headers, timeout=10)
        assert response.status_code == 200 and response.json() == card, response.text
    # The trailing slash: the list, as Starlette's redirect gave before the route.
    assert requests.get(server.url("/v1/models/"), headers=headers, timeout=10).json() == {
        "object": "list", "data": listed
    }  # fmt: skip
    response = requests.get(server.url("/v1/models/org/other"), headers=headers, timeout=10)
    assert response.status_code == 404
    error = response.json()["error"]
    assert error["message"] == "The model `org/other` does not exist." and error["param"] == "model"


@pytest.mark.parametrize(
    "method, path, status",
    [
        ("GET", "/nope", 404),
        ("GET", "/v1/nope", 404),
        ("POST", "/health", 405),
        ("POST", "/v1/models", 405),
        ("GET", "/tokenize", 405),
        ("GET", "/v1/chat/completions", 405),
    ],
)
def test_unknown_routes_and_methods_have_the_error_shape(
    server: RemoteServer, method: str, path: str, status: int
) -> None:
    """Starlette's own 404s and 405s answered `{"detail": ...}`, unlike every other error."""
    headers = {"Authorization": f"Bearer {KEY}"}
    response = requests.request(method, server.url(path), headers=headers, timeout=10)
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert error["code"] == status and path in error["message"], error
    assert error["type"] == ("NotFoundError" if status == 404 else "MethodNotAllowed"), error
    if status == 405:  # which methods the route takes
        assert response.headers["allow"] in ("GET", "POST"), response.headers
