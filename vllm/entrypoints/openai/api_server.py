"""The FastAPI app of `vllm serve` and the function that runs it.

`build_app` wires the endpoints to an `AsyncLLM`, behind CORS (whose refused preflights are JSON
errors too), the API key and the request body limit (middlewares, in that order); `run_server`
validates the flags, binds the port (before loading, so a busy port fails fast), builds the engine,
logs what a user needs to know and serves with uvicorn until SIGINT/SIGTERM, then stops the engine
and its workers (a second signal meanwhile ends the process at once, the workers killed).
"""

import argparse
import asyncio
import collections
import contextlib
import re
import signal
import socket
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any

import uvicorn
from fastapi import FastAPI, Request
from fastapi.middleware.cors import CORSMiddleware
from fastapi.responses import JSONResponse, Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST
from pydantic import BaseModel, ValidationError
from starlette.datastructures import Headers
from starlette.exceptions import HTTPException

import vllm
from vllm.entrypoints.logger import RequestLogger
from vllm.entrypoints.openai.protocol import (
    DEFAULT_MAX_REQUEST_BODY_BYTES,
    ChatCompletionRequest,
    CompletionRequest,
    DetokenizeRequest,
    ModelCard,
    ModelList,
    TokenizeRequest,
)
from vllm.entrypoints.openai.response_json import response_json
from vllm.entrypoints.openai.serving_chat import OpenAIServingChat
from vllm.entrypoints.openai.serving_completion import OpenAIServingCompletion
from vllm.entrypoints.openai.serving_engine import OpenAIError
from vllm.entrypoints.openai.serving_tokenization import OpenAIServingTokenization
from vllm.entrypoints.openai.stop_signals import (
    STOP_SIGNALS,
    StopSignals,
    Terminated,
    restore_handlers,
)
from vllm.logger import init_logger
from vllm.reasoning import REASONING_PARSERS
from vllm.v1.engine.async_llm import AsyncLLM, EngineDeadError
from vllm.v1.metrics.loggers import LoggingStatLogger, PrometheusStatLogger

logger = init_logger(__name__)

# What `run_server` logs once its socket is bound, with the port the OS picked where --port is 0:
# `logged_port` reads it back for whoever started the server with port 0.
SERVING_LINE = "Serving %s on http://%s:%d (OpenAI API under /v1; Ctrl-C stops)"
_SERVING_ADDRESS = re.compile(r"Serving .* on http://(\S+):(\d+) \(OpenAI API under /v1")


def logged_port(log: str, host: str = "127.0.0.1") -> int | None:
    """The port of the first `Serving ... on http://HOST:PORT (OpenAI API ...` line of a server's
    output `log` for `host`; None while it has not been logged (whole: a port is read only with
    the text after it)."""
    for match in _SERVING_ADDRESS.finditer(log):
        if match.group(1).strip("[]") == host.strip("[]"):  # IPv6 hosts are logged in brackets
            return int(match.group(2))
    return None


# Paths an --api-key protects (as vLLM: the OpenAI API; health, metrics and tokenizer stay open).
_PROTECTED_PREFIX = "/v1"


class _ApiKeyMiddleware:
    """401 for /v1 requests without `Authorization: Bearer <key>` (a plain ASGI middleware, so
    that streaming responses still see client disconnects)."""

    def __init__(self, app: Any, api_key: str) -> None:
        self.app, self.expected = app, f"Bearer {api_key}".encode()

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope["path"].startswith(_PROTECTED_PREFIX):
            headers = dict(scope.get("headers") or [])
            if headers.get(b"authorization") != self.expected:
                error = OpenAIError("Unauthorized: a valid API key is required", 401)
                response = JSONResponse(error.response().model_dump(), status_code=401)
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)


class _BodyLimitMiddleware:
    """413 for a request body over `limit` bytes, before any handler runs. A Content-Length over
    the limit is refused unread; any other body (chunked ones too) is read here, counting, and
    refused at the chunk that crosses the limit, so no more than the limit and that one chunk is
    ever held. A body within the limit is handed on as it came."""

    def __init__(self, app: Any, limit: int) -> None:
        self.app, self.limit = app, limit

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope.get("headers") or []).get(b"content-length", b"")
        if declared.isdigit() and int(declared) > self.limit:
            await self._refuse(scope, receive, send)
            return
        chunks: collections.deque = collections.deque()
        size, more = 0, True
        while more:
            message = await receive()
            if message["type"] != "http.request":  # the client left mid-body: nobody to answer
                return
            size += len(message.get("body", b""))
            if size > self.limit:
                await self._refuse(scope, receive, send)
                return
            chunks.append(message)
            more = message.get("more_body", False)

        async def replay() -> dict:
            # The body as it came, then the server's own messages (the disconnect watchers').
            return chunks.popleft() if chunks else await receive()

        await self.app(scope, replay, send)

    async def _refuse(self, scope: dict, receive: Any, send: Any) -> None:
        error = OpenAIError(
            f"the request body is over the server's limit of {self.limit} bytes "
            "(--max-request-body-bytes)",
            413,
        )
        await JSONResponse(error.response().model_dump(), status_code=413)(scope, receive, send)


# The parts of a preflight that Starlette's refusal names ("Disallowed CORS origin, headers"), and
# the flag that allows more of each.
_CORS_FLAGS = {
    "origin": "--allowed-origins",
    "method": "--allowed-methods",
    "headers": "--allowed-headers",
}


class _CORSMiddleware(CORSMiddleware):
    """Starlette's CORS middleware, with a refused preflight answered in the server's error shape
    (`{"error": ...}`, naming the flags to change) instead of plain text, with Starlette's status
    (400) and headers. Allowed preflights, and the CORS headers on other responses, are
    Starlette's."""

    def preflight_response(self, request_headers: Headers) -> Response:
        response = super().preflight_response(request_headers)
        if response.status_code < 400:
            return response
        text = bytes(response.body).decode()
        refused = text.removeprefix("Disallowed CORS ").split(", ")
        flags = [_CORS_FLAGS[part] for part in refused if part in _CORS_FLAGS]
        message = f"{text} (see {', '.join(flags)})" if flags else text
        error = OpenAIError(message, response.status_code)
        # Starlette's CORS headers (Vary, the allowed methods...) stay; the plain text's type and
        # length go with it.
        headers = {
            name: value
            for name, value in response.headers.items()
            if name not in ("content-length", "content-type")
        }
        body = error.response().model_dump()
        return JSONResponse(body, status_code=response.status_code, headers=headers)


async def _parse(request: Request, model: type[BaseModel]) -> Any:
    """The JSON body as `model`; a 400 naming the first bad field otherwise."""
    try:
        body = await request.json()
    except ValueError as e:  # JSONDecodeError, UnicodeDecodeError, an int over Python's digits
        raise OpenAIError(f"the request body is not valid JSON: {e}", 400) from None
    except RecursionError:
        raise OpenAIError("the request body is not valid JSON: nested too deeply", 400) from None
    if not isinstance(body, dict):
        raise OpenAIError("the request body must be a JSON object", 400)
    try:
        parsed = model.model_validate(body)
    except ValidationError as e:
        first = e.errors()[0]
        loc = [str(part) for part in first["loc"]]
        param = loc[0] if loc else None
        raise OpenAIError(f"{'.'.join(loc)}: {first['msg']}", 400, param) from None
    # Those the request class refuses unless neutral are not unknown: its handler checks them.
    refused = getattr(model, "unimplemented_fields", {})
    extra = sorted(k for k in parsed.model_extra or {} if k not in refused)
    if extra:
        logger.warning("%s: ignoring unknown fields %s", request.url.path, extra)
    return parsed


# How long a request may still take once shutdown begins (below uvicorn's graceful 5 s, after
# which it cancels what is left with a plain-text 500).
_SHUTDOWN_GRACE_S = 1.0


async def _unless_disconnected(request: Request, work: Awaitable[Any]) -> Any:
    """Run `work`, cancelling it (which aborts its engine requests) if the client goes away, or
    when the server begins to shut down (`EngineDeadError`, a 503: work still on a worker thread,
    tokenizing a long prompt say, is not ended by stopping the engine, and uvicorn would cancel it
    after its graceful timeout with a plain-text 500)."""
    task = asyncio.ensure_future(work)

    async def disconnected() -> None:
        while (await request.receive())["type"] != "http.disconnect":
            pass

    watcher = asyncio.ensure_future(disconnected())
    # Made by the app's lifespan on the serving loop; absent where no lifespan ran.
    stopping = getattr(request.app.state, "stopping", None)
    stop = asyncio.ensure_future(stopping.wait()) if stopping is not None else None
    waiters = {task, watcher} | ({stop} if stop is not None else set())
    try:
        await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
        if stop is not None and stop.done() and not task.done():
            # Work that has finished in the engine (its answer being written, say) may end,
            # and the handler with it (not at the end of the grace).
            await asyncio.wait(
                {task, watcher}, timeout=_SHUTDOWN_GRACE_S, return_when=asyncio.FIRST_COMPLETED
            )
    finally:
        for waiter in waiters - {task}:
            waiter.cancel()
        if not task.done():
            # Also when this handler is cancelled itself: `work` must not outlive it.
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
    if not task.cancelled():
        return task.result()
    if watcher.done() and not watcher.cancelled():
        return Response(status_code=499)
    raise EngineDeadError("the server is shutting down")


async def _answer_in_worker(
    request: Request, handler: Callable[[Any], BaseModel], body: BaseModel
) -> Response:
    """`handler(body)` as JSON, both computed on a worker thread: (de)tokenizing megabytes takes
    seconds, during which the event loop answers every other request and /health. The JSON is
    written by pydantic: these answers hold only ints and strings, so it is the same JSON as
    `JSONResponse(model_dump())`, five times faster (0.5 s for the 23 M ids of a 23 MB prompt,
    during which the GIL is held either way). A client that leaves, or a shutdown, ends the wait
    (the thread finishes on its own)."""
    work = asyncio.to_thread(lambda: handler(body).model_dump_json())
    text = await _unless_disconnected(request, work)
    if isinstance(text, Response):
        return text
    return Response(text, media_type="application/json")


async def _respond(result: Any) -> Response:
    """The HTTP response for a completion handler's `result`: a response as is, a stream as
    server-sent events, a model as its JSON."""
    if isinstance(result, Response):
        return result
    if isinstance(result, AsyncIterator):
        return StreamingResponse(result, media_type="text/event-stream")
    # The JSON of a long prompt's echo and logprobs is megabytes, seconds of writing: done on a
    # worker thread, in pieces between which the event loop runs (`JSONResponse(model_dump())`'s
    # bytes, with the same writers).
    body = await asyncio.to_thread(response_json, result)
    return Response(body, media_type="application/json")


def build_app(
    engine: AsyncLLM,
    served_model_names: list[str],
    model_path: str,
    *,
    api_key: str | None = None,
    enable_tokenizer_info_endpoint: bool = True,
    reasoning_parser: str | None = None,
    trust_request_chat_template: bool = False,
    max_request_body_bytes: int = DEFAULT_MAX_REQUEST_BODY_BYTES,
    allowed_origins: Sequence[str] = ("*",),
    allowed_methods: Sequence[str] = ("*",),
    allowed_headers: Sequence[str] = ("*",),
    allow_credentials: bool = False,
    request_logger: RequestLogger | None = None,
    enable_prompt_tokens_details: bool = False,
) -> FastAPI:
    """The OpenAI-compatible app over `engine` (see docs/serving.md for the endpoints);
    `request_logger` logs each request handed to the engine (`--enable-log-requests`);
    `enable_prompt_tokens_details` adds them to the replies' usage
    (`--enable-prompt-tokens-details`)."""
    parser = None
    if reasoning_parser is not None:
        parser = REASONING_PARSERS[reasoning_parser](engine.tokenizer)
    shared = (engine, served_model_names, model_path)
    completion = OpenAIServingCompletion(
        *shared,
        request_logger=request_logger,
        enable_prompt_tokens_details=enable_prompt_tokens_details,
    )
    chat = OpenAIServingChat(
        *shared,
        request_logger=request_logger,
        enable_prompt_tokens_details=enable_prompt_tokens_details,
        reasoning_parser=parser,
        trust_request_chat_template=trust_request_chat_template,
        max_prompt_chars=max_request_body_bytes,
    )
    tokenization = OpenAIServingTokenization(*shared, chat=chat)
    metrics = PrometheusStatLogger(served_model_names[0])
    engine.add_stat_logger(metrics)
    # A model card's `created` is when this app began serving the model: one value for every
    # request (a card made per request changed it each second, so list and retrieve disagreed).
    created = int(time.time())

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        # Set by `_Server` when shutdown begins: ends the requests that wait outside the engine.
        # Made here, on the loop that serves (an Event is bound to the first loop that waits).
        app.state.stopping = asyncio.Event()
        yield

    app = FastAPI(title="vllm-k3", version=vllm.__version__, lifespan=lifespan)
    # The last added runs first: a request without the key is refused before its body is read,
    # and CORS comes before both, since a browser's preflight carries no key and a page can read
    # the 401s and 413s only with the CORS headers on them.
    app.add_middleware(_BodyLimitMiddleware, limit=max_request_body_bytes)
    if api_key:
        app.add_middleware(_ApiKeyMiddleware, api_key=api_key)
    app.add_middleware(
        _CORSMiddleware,
        allow_origins=list(allowed_origins),
        allow_methods=list(allowed_methods),
        allow_headers=list(allowed_headers),
        allow_credentials=allow_credentials,
    )

    @app.exception_handler(OpenAIError)
    async def openai_error(_: Request, e: OpenAIError) -> JSONResponse:
        return JSONResponse(e.response().model_dump(), status_code=e.code)

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, e: HTTPException) -> JSONResponse:
        # Starlette's own errors (no such route, a method the route lacks) in the same shape as
        # ours, not `{"detail": ...}`; the 405's `Allow` header is kept.
        message = f"{e.detail}: {request.method} {request.url.path}"
        body = OpenAIError(message, e.status_code).response().model_dump()
        return JSONResponse(body, status_code=e.status_code, headers=e.headers)

    @app.exception_handler(EngineDeadError)
    async def engine_dead(_: Request, e: EngineDeadError) -> JSONResponse:
        return await openai_error(_, OpenAIError(str(e), 503))

    @app.exception_handler(Exception)
    async def internal_error(request: Request, e: Exception) -> JSONResponse:
        logger.exception("%s failed", request.url.path)
        error = OpenAIError(f"internal error: {type(e).__name__}: {e}", 500)
        return JSONResponse(error.response().model_dump(), status_code=500)

    @app.get("/health")
    @app.get("/ping")
    async def health() -> Response:
        completion.check_health()
        return Response(status_code=200)

    @app.get("/version")
    async def version() -> dict[str, str]:
        return {"version": vllm.__version__}

    def card(name: str) -> ModelCard:
        return ModelCard(
            id=name, created=created, root=model_path, max_model_len=completion.max_model_len
        )

    @app.get("/v1/models")
    async def models() -> JSONResponse:
        return JSONResponse(
            ModelList(data=[card(name) for name in served_model_names]).model_dump()
        )

    @app.get("/v1/models/{model:path}")
    async def model(model: str) -> JSONResponse:
        # OpenAI's "retrieve model"; `:path` since a served name may hold slashes (org/name).
        if not model:  # `/v1/models/`: the list, as Starlette's redirect to /v1/models gave
            return await models()
        completion.check_model(model)
        return JSONResponse(card(model).model_dump())

    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        body = await _parse(request, CompletionRequest)
        completion.check_health()
        return await _respond(
            await _unless_disconnected(request, completion.create_completion(body))
        )

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Response:
        body = await _parse(request, ChatCompletionRequest)
        completion.check_health()
        work = chat.create_chat_completion(body)
        return await _respond(await _unless_disconnected(request, work))

    @app.post("/tokenize")
    async def tokenize(request: Request) -> Response:
        body = await _parse(request, TokenizeRequest)
        return await _answer_in_worker(request, tokenization.tokenize, body)

    @app.post("/detokenize")
    async def detokenize(request: Request) -> Response:
        body = await _parse(request, DetokenizeRequest)
        return await _answer_in_worker(request, tokenization.detokenize, body)

    if enable_tokenizer_info_endpoint:

        @app.get("/tokenizer_info")
        async def tokenizer_info() -> JSONResponse:
            return JSONResponse(tokenization.tokenizer_info())

    @app.get("/metrics")
    async def prometheus() -> Response:
        return Response(metrics.exposition(), media_type=CONTENT_TYPE_LATEST)

    return app


class BindError(OSError):
    """The server's address could not be bound (in use, not local, no permission)."""


class _Server(uvicorn.Server):
    """uvicorn's server, stopping the engine as soon as shutdown begins.

    uvicorn's graceful shutdown waits for open responses and, after `timeout_graceful_shutdown`,
    cancels them mid-stream (a traceback each, and clients left without `[DONE]`). Stopping the
    engine first ends every in-flight request at once with a 503 "the server is shutting down"
    (streams: that error event, then `[DONE]`), so the wait is short and the exit clean."""

    def __init__(self, config: uvicorn.Config, engine: AsyncLLM) -> None:
        super().__init__(config)  # config.app: an app of `build_app` over `engine`
        self.engine = engine

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        self.engine.stop()
        stopping = getattr(self.config.app.state, "stopping", None)
        if stopping is not None:  # None: the lifespan is off
            stopping.set()
        await super().shutdown(sockets)
        if self.force_exit:
            # A second Ctrl-C skips the app's lifespan shutdown, which then ends cancelled and
            # is logged as an ERROR traceback; it is instant here (the engine stops afterwards,
            # in `run_server`), so it runs anyway.
            await self.lifespan.shutdown()


def bind_socket(host: str | None, port: int) -> socket.socket:
    """A listening TCP socket on host:port (all interfaces for None)."""
    family = socket.AF_INET6 if host and ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host or "0.0.0.0", port))
    except OSError as e:
        sock.close()
        raise BindError(
            f"argument --host/--port: cannot bind {host or '0.0.0.0'}:{port}: {e}"
        ) from None
    sock.listen(2048)
    sock.set_inheritable(True)
    return sock


def stat_loggers(args: argparse.Namespace) -> list[LoggingStatLogger]:
    """The engine's log of throughput, load and cache usage (every 10 s of traffic), unless
    `--disable-log-stats` (the `EngineArgs` field, which `LLM` takes too, logging no statistics
    with either value); /metrics is built by `build_app` either way."""
    return [] if args.disable_log_stats else [LoggingStatLogger()]


def run_server(args: argparse.Namespace, engine_config: Any) -> None:
    """Serve `engine_config` (validated `VllmConfig`) with the server flags in `args`."""
    from vllm.entrypoints.cli.startup import log_startup

    stop = StopSignals()
    previous = {sig: signal.signal(sig, stop) for sig in STOP_SIGNALS}
    try:
        sock = bind_socket(args.host, args.port)
    except BindError:
        restore_handlers(previous)
        raise
    served = args.served_model_name or [args.model]
    engine = async_llm = None
    stopped = False
    try:
        # Imported only now: a busy port fails before the model code is even loaded.
        from vllm.v1.engine.llm_engine import LLMEngine

        engine = LLMEngine(engine_config)
        log_startup(engine, served, args)
        async_llm = AsyncLLM(engine, stat_loggers(args))
        app = build_app(
            async_llm,
            served,
            args.model,
            api_key=args.api_key,
            enable_tokenizer_info_endpoint=args.enable_tokenizer_info_endpoint,
            reasoning_parser=args.reasoning_parser,
            trust_request_chat_template=args.trust_request_chat_template,
            max_request_body_bytes=args.max_request_body_bytes,
            allowed_origins=args.allowed_origins,
            allowed_methods=args.allowed_methods,
            allowed_headers=args.allowed_headers,
            allow_credentials=args.allow_credentials,
            request_logger=RequestLogger(args.max_log_len) if args.enable_log_requests else None,
            enable_prompt_tokens_details=args.enable_prompt_tokens_details,
        )
        config = uvicorn.Config(
            app,
            log_level=args.uvicorn_log_level,
            timeout_graceful_shutdown=5,
            timeout_keep_alive=30,
        )
        host = args.host or "0.0.0.0"
        if ":" in host:  # an IPv6 address goes in brackets in a URL
            host = f"[{host}]"
        logger.info(
            SERVING_LINE,
            ", ".join(served),
            host,
            sock.getsockname()[1],  # the OS's pick where --port is 0
        )
        _Server(config, async_llm).run(sockets=[sock])
        stopped = True  # uvicorn took the signal
    except (KeyboardInterrupt, Terminated):
        stopped = True
    finally:
        # Not after an error: a signal then interrupts the cleanup with a traceback that keeps
        # the error's, where an exit at once would lose it.
        stop.shutting_down = stop.shutting_down or stopped
        try:
            logger.info("Shutting down")
            if async_llm is not None:
                async_llm.shutdown()
            elif engine is not None:
                engine.shutdown()
            sock.close()
        finally:
            restore_handlers(previous)
