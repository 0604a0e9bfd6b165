"""The app over the scripted engine, served by uvicorn on a thread of the test process (so that a
test can hold its tokenizer and watch its engine): tokenizing, rendering and detokenizing a
request's prompt happen off the event loop, which answers /health meanwhile."""

import concurrent.futures
import contextlib
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest
import requests
import uvicorn

sys.path.insert(0, str(Path(__file__).parent))

from fake_engine import FakeEngine  # noqa: E402

from vllm.entrypoints.openai.api_server import bind_socket, build_app  # noqa: E402
from vllm.v1.engine.async_llm import AsyncLLM  # noqa: E402

SCRIPT = "The answer is 4."
USER = [{"role": "user", "content": "2+2?"}]
# Bounds only a failing run (a request held on the event loop stalls /health until released);
# a passing one answers at once.
STALL_TIMEOUT = 10


@contextlib.contextmanager
def _serve(app) -> Iterator[str]:
    """`app` served by uvicorn on a thread of this process, on a port the OS picks; its URL."""
    sock = bind_socket("127.0.0.1", 0)
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 60
        while not server.started:
            assert thread.is_alive() and time.monotonic() < deadline, "uvicorn did not start"
            time.sleep(0.01)
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        server.should_exit = True
        thread.join(60)
        sock.close()


@pytest.fixture(scope="module")
def served() -> Iterator[SimpleNamespace]:
    engine = FakeEngine(SCRIPT)
    llm = AsyncLLM(engine)
    try:
        with _serve(build_app(llm, ["fake"], "fake")) as url:
            yield SimpleNamespace(url=url, tokenizer=llm.tokenizer)
    finally:
        llm.shutdown()


def _hold(
    monkeypatch: pytest.MonkeyPatch, obj: object, name: str
) -> tuple[threading.Event, threading.Event]:
    """Make `obj.name` wait, once entered (first event), until released (second event)."""
    entered, release = threading.Event(), threading.Event()
    original = getattr(obj, name)

    def held(*args, **kwargs):
        entered.set()
        release.wait()
        return original(*args, **kwargs)

    monkeypatch.setattr(obj, name, held)
    return entered, release


@pytest.mark.parametrize(
    "path, body, method",
    [
        ("/tokenize", {"prompt": "hello"}, "encode"),
        ("/tokenize", {"messages": USER}, "apply_chat_template"),
        ("/detokenize", {"tokens": [104, 105]}, "decode"),
        ("/v1/completions", {"prompt": "hello", "max_tokens": 2}, "encode"),
        # A token-id prompt is decoded for echo.
        ("/v1/completions", {"prompt": [104, 105], "max_tokens": 2, "echo": True}, "decode"),
        # Echo with logprobs detokenizes every prompt token, whole and streamed.
        ("/v1/completions", {"prompt": "hello", "max_tokens": 1, "echo": True, "logprobs": 1},
         "token_bytes"),
        ("/v1/completions",
         {"prompt": "hello", "max_tokens": 1, "echo": True, "logprobs": 1, "stream": True},
         "token_bytes"),
        ("/v1/chat/completions", {"messages": USER, "max_tokens": 2}, "apply_chat_template"),
        ("/v1/chat/completions", {"messages": USER, "max_tokens": 2}, "encode"),
    ],
)  # fmt: skip
def test_health_answers_while_a_request_is_tokenized(
    served: SimpleNamespace,
    monkeypatch: pytest.MonkeyPatch,
    path: str,
    body: dict,
    method: str,
) -> None:
    """The tokenizer call is held until /health has answered: on the event loop it would hold
    the loop too, and /health would wait for it."""
    entered, release = _hold(monkeypatch, served.tokenizer, method)
    with concurrent.futures.ThreadPoolExecutor(1) as client:
        held = client.submit(requests.post, served.url + path, json=body, timeout=60)
        try:
            assert entered.wait(60), f"{path} never called tokenizer.{method}"
            health = requests.get(served.url + "/health", timeout=STALL_TIMEOUT)
            assert health.status_code == 200
            assert not held.done()  # answered while the request was still held
        finally:
            release.set()
        response = held.result()
    assert response.status_code == 200, response.text
