"""The app over the scripted engine, served by uvicorn on a thread of the test process (so that a
test can hold its tokenizer and watch its engine): tokenizing, rendering and detokenizing a
request's prompt, and writing a tokenizer endpoint's answer, happen off the event loop, which
answers /health meanwhile; a body over
`max_request_body_bytes` is a 413 that no handler (nor the engine) sees, refused unread when its
Content-Length says so and otherwise at the chunk that crosses the limit; CORS preflights from the
allowed origins are answered (without the API key) as Starlette answers them, refused ones are a
400 in the server's error shape, and the errors carry the CORS headers."""

import asyncio
import concurrent.futures
import contextlib
import re
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import pydantic
import pytest
import requests
import uvicorn
from starlette.datastructures import Headers
from starlette.middleware.cors import CORSMiddleware

sys.path.insert(0, str(Path(__file__).parent))

from fake_engine import FakeEngine  # noqa: E402

from vllm.entrypoints.openai import serving_tokenization  # noqa: E402
from vllm.entrypoints.openai.api_server import (  # noqa: E402
    _SHUTDOWN_GRACE_S,
    _Server,
    _unless_disconnected,
    bind_socket,
    build_app,
)
from vllm.v1.engine.async_llm import AsyncLLM, EngineDeadError  # noqa: E402

SCRIPT = "The answer is 4."
KEY = "sk-test"
HEADERS = {"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"}
LIMIT = 4096
ORIGIN = "https://ui.example"
CORS_METHODS = ["GET", "POST"]
CORS_HEADERS = ["authorization", "content-type"]
USER = [{"role": "user", "content": "2+2?"}]
# Bounds only a failing run (a request held on the event loop stalls /health until released);
# a passing one answers at once.
STALL_TIMEOUT = 10


@contextlib.contextmanager
def _serve(app, server: uvicorn.Server | None = None) -> Iterator[str]:
    """`app` served by uvicorn (or by `server`, of `app`) on a thread of this process, on a port
    the OS picks; its URL."""
    sock = bind_socket("127.0.0.1", 0)
    server = server or uvicorn.Server(uvicorn.Config(app, log_level="warning"))
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


@pytest.fixture(scope="module")
def guarded() -> Iterator[SimpleNamespace]:
    engine = FakeEngine(SCRIPT)
    llm = AsyncLLM(engine)
    app = build_app(
        llm,
        ["fake"],
        "fake",
        api_key=KEY,
        max_request_body_bytes=LIMIT,
        allowed_origins=[ORIGIN],
        allowed_methods=CORS_METHODS,
        allowed_headers=CORS_HEADERS,
    )
    try:
        with _serve(app) as url:
            yield SimpleNamespace(url=url, engine=engine, app=app)
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
    _assert_health_answers_while_held(served.url, path, body, entered, release)


@pytest.mark.parametrize(
    "path, body, module, name, field",
    [
        ("/tokenize", {"prompt": "hello"}, serving_tokenization, "TokenizeResponse", "tokens"),
        ("/detokenize", {"tokens": [104, 105]}, serving_tokenization, "DetokenizeResponse",
         "prompt"),
    ],
)  # fmt: skip
def test_health_answers_while_a_tokenizer_answer_is_written(
    served: SimpleNamespace,
    monkeypatch: pytest.MonkeyPatch,
    path: str,
    body: dict,
    module: object,
    name: str,
    field: str,
) -> None:
    """The answer's JSON (the ids of a long prompt: megabytes) is held while it is written, until
    /health has answered."""
    entered, release = threading.Event(), threading.Event()

    class Held(getattr(module, name)):
        @pydantic.field_serializer(field)
        def _held(self, value):
            entered.set()
            release.wait()
            return value

    monkeypatch.setattr(module, name, Held)
    _assert_health_answers_while_held(served.url, path, body, entered, release)


def _assert_health_answers_while_held(
    url: str, path: str, body: dict, entered: threading.Event, release: threading.Event
) -> None:
    """POST `body` to `path`; once it is held (`entered`), /health must answer before `release`
    lets the request finish, with a 200."""
    with concurrent.futures.ThreadPoolExecutor(1) as client:
        held = client.submit(requests.post, url + path, json=body, timeout=60)
        try:
            assert entered.wait(60), f"{path} was never held"
            health = requests.get(url + "/health", timeout=STALL_TIMEOUT)
            assert health.status_code == 200
            assert not held.done()  # answered while the request was still held
        finally:
            release.set()
        response = held.result()
    assert response.status_code == 200, response.text


@pytest.mark.parametrize(
    "path, body, method",
    [
        ("/v1/completions", {"prompt": "hello", "max_tokens": 2}, "encode"),
        ("/v1/chat/completions", {"messages": USER, "max_tokens": 2}, "apply_chat_template"),
        ("/tokenize", {"prompt": "hello"}, "encode"),
        ("/detokenize", {"tokens": [104, 105]}, "decode"),
    ],
)  # fmt: skip
def test_shutdown_ends_a_request_held_on_a_worker_thread(
    monkeypatch: pytest.MonkeyPatch, path: str, body: dict, method: str
) -> None:
    """A request still tokenizing (a worker thread, not yet in the engine) when shutdown begins
    gets the 503 that the engine's requests get, at once: stopping the engine did not end it, and
    uvicorn cancelled it after its graceful timeout with a plain-text 500."""
    llm = AsyncLLM(FakeEngine(SCRIPT))
    entered, release = _hold(monkeypatch, llm.tokenizer, method)
    app = build_app(llm, ["fake"], "fake")
    server = _Server(uvicorn.Config(app, log_level="warning", timeout_graceful_shutdown=5), llm)
    try:
        with (
            _serve(app, server) as url,
            concurrent.futures.ThreadPoolExecutor(1) as client,
        ):
            held = client.submit(requests.post, url + path, json=body, timeout=60)
            try:
                assert entered.wait(60), f"{path} was never held"
                server.should_exit = True
                # Before the tokenizer lets go, and well before the graceful timeout.
                response = held.result(timeout=3)
            finally:
                release.set()
    finally:
        llm.shutdown()
    assert response.status_code == 503, response.text
    assert response.json()["error"]["message"] == "the server is shutting down"


class _Quiet:
    """The request `_unless_disconnected` watches: a client that never leaves, and the app state
    a lifespan made."""

    def __init__(self) -> None:
        self.app = SimpleNamespace(state=SimpleNamespace(stopping=asyncio.Event()))

    async def receive(self) -> dict:
        await asyncio.Event().wait()
        return {}


def test_a_cancelled_handler_cancels_its_work() -> None:
    """uvicorn cancelling a handler (its graceful timeout) left the work running, to fail later
    as "Task exception was never retrieved"."""

    async def run() -> bool:
        started, ended = asyncio.Event(), asyncio.Event()

        async def work() -> None:
            started.set()
            try:
                await asyncio.sleep(60)
            finally:
                ended.set()

        handler = asyncio.ensure_future(_unless_disconnected(_Quiet(), work()))
        await started.wait()
        handler.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await handler
        return ended.is_set()

    assert asyncio.run(run())


@pytest.mark.parametrize("seconds, answered", [(0.1, True), (30.0, False)])
def test_shutdown_lets_work_about_to_end_finish(seconds: float, answered: bool) -> None:
    """Work still running when shutdown begins has a moment to end (an answer being written);
    after it, a 503."""

    async def run() -> object:
        request = _Quiet()

        async def work() -> str:
            request.app.state.stopping.set()
            await asyncio.sleep(seconds)
            return "answer"

        try:
            return await _unless_disconnected(request, work())
        except EngineDeadError as e:
            return e

    start = time.perf_counter()
    result = asyncio.run(run())
    if answered:
        assert result == "answer"
        # It ends when the work does, not at the end of the grace.
        assert time.perf_counter() - start < _SHUTDOWN_GRACE_S / 2
    else:
        assert isinstance(result, EngineDeadError) and str(result) == "the server is shutting down"


def test_the_app_serves_on_a_second_event_loop() -> None:
    """The shutdown Event is made by each serving loop's lifespan: one made with the app was
    bound to the first loop, and every request on a second one was a 503."""
    llm = AsyncLLM(FakeEngine(SCRIPT))
    app = build_app(llm, ["fake"], "fake")
    try:
        for _ in range(2):
            with _serve(app) as url:
                response = requests.post(url + "/tokenize", json={"prompt": "hi"}, timeout=30)
                assert response.status_code == 200, response.text
    finally:
        llm.shutdown()


@pytest.mark.parametrize(
    "path, body",
    [
        ("/v1/completions", {"prompt": "hello", "max_tokens": 2}),
        ("/v1/chat/completions", {"messages": USER, "max_tokens": 2}),
    ],
)
def test_latencies_count_the_tokenization(
    monkeypatch: pytest.MonkeyPatch, path: str, body: dict
) -> None:
    """As upstream's, from the request's arrival: they counted from the engine's `add_request`,
    after the handler had tokenized the prompt (docs/serving.md said they included it)."""
    llm = AsyncLLM(FakeEngine(SCRIPT))
    encode = llm.tokenizer.encode

    def slow(*args, **kwargs):
        time.sleep(0.5)  # a long prompt
        return encode(*args, **kwargs)

    monkeypatch.setattr(llm.tokenizer, "encode", slow)
    try:
        with _serve(build_app(llm, ["fake"], "fake")) as url:
            assert requests.post(url + path, json=body, timeout=30).status_code == 200
            metrics = requests.get(url + "/metrics", timeout=30).text
    finally:
        llm.shutdown()
    for name in ("time_to_first_token_seconds", "e2e_request_latency_seconds"):
        total = re.search(rf"^vllm:{name}_sum{{[^}}]*}} (\S+)$", metrics, re.M)
        assert total is not None and float(total[1]) >= 0.5, (name, metrics)


def _completion_body(size: int) -> bytes:
    """A valid completion request of exactly `size` bytes (padded in a field the API ignores)."""
    head, tail = b'{"prompt": "hi", "max_tokens": 1, "pad": "', b'"}'
    return head + b"x" * (size - len(head) - len(tail)) + tail


TOO_LARGE = {
    "error": {
        "message": f"the request body is over the server's limit of {LIMIT} bytes "
        "(--max-request-body-bytes)",
        "type": "ContentTooLarge",
        "param": None,
        "code": 413,
    }
}


@pytest.mark.parametrize("chunked", [False, True], ids=["content_length", "chunked"])
def test_a_body_over_the_limit_is_a_413_the_engine_never_sees(
    guarded: SimpleNamespace, monkeypatch: pytest.MonkeyPatch, chunked: bool
) -> None:
    added = []
    add_request = guarded.engine.add_request

    def spy(request_id, prompt, params):
        added.append(request_id)
        return add_request(request_id, prompt, params)

    monkeypatch.setattr(guarded.engine, "add_request", spy)

    def post(body: bytes) -> requests.Response:
        # A generator makes requests send the body chunked, without a Content-Length.
        data = iter([body[: LIMIT // 2], body[LIMIT // 2 :]]) if chunked else body
        url = guarded.url + "/v1/completions"
        return requests.post(url, data=data, headers=HEADERS, timeout=60)

    response = post(_completion_body(LIMIT + 1))
    assert response.status_code == 413, response.text
    assert response.json() == TOO_LARGE
    assert added == []
    response = post(_completion_body(LIMIT))  # at the limit: served, and the engine sees it
    assert response.status_code == 200, response.text
    assert len(added) == 1


def test_a_request_without_the_key_is_refused_before_its_body_is_read(
    guarded: SimpleNamespace,
) -> None:
    response = requests.post(
        guarded.url + "/v1/completions", data=_completion_body(LIMIT + 1), timeout=60
    )
    assert response.status_code == 401, response.text


def _call(app, headers: list[tuple[bytes, bytes]], chunks: list[bytes]) -> tuple[int, list]:
    """Run one POST /v1/completions through the ASGI `app` with a body sent in `chunks`; the
    response status and the chunks the app took."""
    taken: list[bytes] = []
    sent: list[dict] = []

    async def receive() -> dict:
        if len(taken) == len(chunks):  # all sent: what a server says once the client is gone
            return {"type": "http.disconnect"}
        taken.append(chunks[len(taken)])
        return {"type": "http.request", "body": taken[-1], "more_body": len(taken) < len(chunks)}

    async def send(message: dict) -> None:
        sent.append(message)

    scope = {
        "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST",
        "scheme": "http", "path": "/v1/completions", "raw_path": b"/v1/completions",
        "query_string": b"", "root_path": "", "client": ("127.0.0.1", 1), "server": None,
        "headers": [(b"authorization", f"Bearer {KEY}".encode()), *headers],
    }  # fmt: skip
    asyncio.run(app(scope, receive, send))
    return sent[0]["status"], taken


def test_the_limit_is_checked_before_the_body_is_taken(guarded: SimpleNamespace) -> None:
    """A declared Content-Length over the limit: no chunk taken. A chunked body: taken up to the
    chunk that crosses the limit, no further."""
    chunks = [b"x" * 1000] * 20
    status, taken = _call(guarded.app, [(b"content-length", b"20000")], chunks)
    assert (status, taken) == (413, [])
    status, taken = _call(guarded.app, [(b"transfer-encoding", b"chunked")], chunks)
    assert (status, len(taken)) == (413, LIMIT // 1000 + 1)


def _preflight_headers(
    origin: str, method: str = "POST", headers: str = "authorization, content-type"
) -> dict[str, str]:
    return {
        "Origin": origin,
        "Access-Control-Request-Method": method,
        "Access-Control-Request-Headers": headers,
    }


def _preflight(url: str, origin: str, **kwargs: str) -> requests.Response:
    headers = _preflight_headers(origin, **kwargs)
    return requests.options(url + "/v1/chat/completions", headers=headers, timeout=60)


def test_cors_preflight_answers_with_the_configured_origin(guarded: SimpleNamespace) -> None:
    """A browser's preflight carries no API key: it is answered all the same, as Starlette's
    CORSMiddleware answers it (same status, body and headers, uvicorn's own aside)."""
    response = _preflight(guarded.url, ORIGIN)
    assert response.status_code == 200, response.text
    assert response.headers["access-control-allow-origin"] == ORIGIN
    assert "POST" in response.headers["access-control-allow-methods"]
    assert "authorization" in response.headers["access-control-allow-headers"].lower()
    starlette = CORSMiddleware(
        None, allow_origins=[ORIGIN], allow_methods=CORS_METHODS, allow_headers=CORS_HEADERS
    ).preflight_response(Headers(_preflight_headers(ORIGIN)))
    assert (response.status_code, response.content) == (starlette.status_code, starlette.body)
    served = {name.lower(): value for name, value in response.headers.items()}
    del served["date"], served["server"]  # uvicorn's
    assert served == dict(starlette.headers)


@pytest.mark.parametrize(
    "origin, method, headers, refused",
    [
        ("https://elsewhere.example", "POST", "content-type", "origin (see --allowed-origins)"),
        (ORIGIN, "PUT", "content-type", "method (see --allowed-methods)"),
        (ORIGIN, "POST", "authorization, x-other", "headers (see --allowed-headers)"),
        ("https://elsewhere.example", "PUT", "x-other",
         "origin, method, headers (see --allowed-origins, --allowed-methods, --allowed-headers)"),
    ],
    ids=["origin", "method", "headers", "all"],
)  # fmt: skip
def test_a_refused_cors_preflight_is_a_json_error(
    guarded: SimpleNamespace, origin: str, method: str, headers: str, refused: str
) -> None:
    """Starlette's 400, in the server's error shape (not its plain-text `Disallowed CORS ...`),
    naming the flags that would allow the request; its CORS headers are kept."""
    response = _preflight(guarded.url, origin, method=method, headers=headers)
    assert response.status_code == 400, response.text
    assert response.headers["content-type"] == "application/json"
    assert response.json() == {
        "error": {
            "message": f"Disallowed CORS {refused}",
            "type": "BadRequestError",
            "param": None,
            "code": 400,
        }
    }
    assert response.headers["vary"].startswith("Origin")
    assert response.headers["access-control-allow-methods"] == "GET, POST"
    # Starlette names an allowed origin even when the method or headers are refused.
    assert response.headers.get("access-control-allow-origin") == (
        ORIGIN if origin == ORIGIN else None
    )


@pytest.mark.parametrize(
    "headers, status", [({}, 401), (HEADERS, 413)], ids=["no_key", "too_large"]
)
def test_the_errors_of_the_guards_carry_the_cors_headers(
    guarded: SimpleNamespace, headers: dict, status: int
) -> None:
    """Without them the page could not read why its request failed."""
    response = requests.post(
        guarded.url + "/v1/completions",
        data=_completion_body(LIMIT + 1),
        headers={**headers, "Origin": ORIGIN},
        timeout=60,
    )
    assert response.status_code == status, response.text
    assert response.headers["access-control-allow-origin"] == ORIGIN
