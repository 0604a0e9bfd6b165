"""What every endpoint shares: the served model names, the OpenAI error shape, prompt length
checks, and merging the output streams of a request's prompts."""

import asyncio
import json
import re
from collections.abc import AsyncIterator
from http import HTTPStatus
from typing import Any

from pydantic import BaseModel

from vllm.entrypoints.logger import RequestLogger
from vllm.entrypoints.openai.protocol import ErrorInfo, ErrorResponse, UsageInfo
from vllm.logger import init_logger
from vllm.outputs import RequestOutput
from vllm.sampling_params import SamplingParams, truncate_prompt
from vllm.v1.engine.async_llm import AsyncLLM

logger = init_logger(__name__)

_ERROR_TYPES = {
    400: "BadRequestError",
    401: "Unauthorized",
    404: "NotFoundError",
    # RFC 9110's name, which Python's HTTPStatus phrase took only in 3.13.
    413: "ContentTooLarge",
    503: "ServiceUnavailableError",
}


class OpenAIError(Exception):
    """An error that becomes `{"error": {message, type, param, code}}` with status `code`."""

    def __init__(self, message: str, code: int = 400, param: str | None = None) -> None:
        # A message quoting the request's text may hold a lone surrogate, which the JSON
        # response could not encode: escaped, as Python would print it.
        message = message.encode("utf-8", "backslashreplace").decode("utf-8")
        super().__init__(message)
        self.message, self.code, self.param = message, code, param

    def response(self) -> ErrorResponse:
        error_type = _ERROR_TYPES.get(self.code, HTTPStatus(self.code).phrase.replace(" ", ""))
        return ErrorResponse(
            error=ErrorInfo(message=self.message, type=error_type, param=self.param, code=self.code)
        )


def bad_request(error: ValueError, fields: "type[BaseModel] | None" = None) -> OpenAIError:
    """A 400 for a refused value; `param` is the first request field its message names."""
    message = str(error)
    names = set(fields.model_fields) if fields is not None else set()
    names |= set(getattr(fields, "unimplemented_fields", ()))
    names |= {"prompt", "messages", "max_tokens", "tokens"}
    param = next((w for w in re.findall(r"[a-z_]+", message) if w in names), None)
    return OpenAIError(message, 400, param)


def sse(
    payload: "BaseModel | dict[str, Any] | str",
    exclude_unset: bool = False,
    exclude_none: bool = False,
) -> str:
    """One server-sent event carrying `payload` (`[DONE]` as is); a model without the fields
    left unset if `exclude_unset` (upstream's chat chunks; its completion chunks have all), or
    without those that are None if `exclude_none` (upstream's final usage chunks)."""
    if isinstance(payload, BaseModel):
        data = payload.model_dump_json(exclude_unset=exclude_unset, exclude_none=exclude_none)
    elif isinstance(payload, dict):
        data = json.dumps(payload)
    else:
        data = payload
    return f"data: {data}\n\n"


async def merge_streams(streams: list[AsyncIterator[Any]]) -> AsyncIterator[tuple[int, Any]]:
    """Items of several async iterators as they come, tagged with the iterator's index; an
    exception in one stops all (the others are closed, which aborts their requests)."""
    if len(streams) == 1:
        async for item in streams[0]:
            yield 0, item
        return
    queue: asyncio.Queue = asyncio.Queue()
    done = object()

    async def pump(i: int, stream: AsyncIterator[Any]) -> None:
        try:
            async for item in stream:
                await queue.put((i, item))
            await queue.put((i, done))
        except BaseException as e:  # noqa: B036 - forwarded to the consumer, then re-raised
            await queue.put((i, e))
            raise

    tasks = [asyncio.create_task(pump(i, s)) for i, s in enumerate(streams)]
    try:
        remaining = len(tasks)
        while remaining:
            i, item = await queue.get()
            if item is done:
                remaining -= 1
            elif isinstance(item, BaseException):
                raise item
            else:
                yield i, item
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for stream in streams:
            await stream.aclose()


class OpenAIServing:
    """State the endpoint handlers share: engine, served names, limits."""

    def __init__(
        self,
        engine: AsyncLLM,
        served_model_names: list[str],
        model_path: str,
        request_logger: RequestLogger | None = None,
        enable_prompt_tokens_details: bool = False,
    ) -> None:
        self.engine = engine
        self.request_logger = request_logger
        self.enable_prompt_tokens_details = enable_prompt_tokens_details
        self.tokenizer = engine.tokenizer
        self.served_model_names = served_model_names
        self.model_path = model_path
        self.max_model_len: int = engine.config.model_config.max_model_len
        # The model's generation config: defaults of the sampling fields a request leaves unset.
        self.sampling_defaults = engine.config.model_config.generation_config.sampling_defaults

    async def add_request(
        self, request_id: str, prompt_ids: list[int], params: SamplingParams, arrival: float
    ) -> AsyncIterator[RequestOutput]:
        """The engine's `add_request`, logged first with `--enable-log-requests`."""
        if self.request_logger is not None:
            self.request_logger.log_request(request_id, prompt_ids, params)
        return await self.engine.add_request(request_id, prompt_ids, params, arrival)

    def final_usage(
        self, prompt_tokens: int, completion_tokens: int, cached_tokens: int
    ) -> UsageInfo:
        """A reply's usage, as a whole response or a stream's final usage chunk gives it: with
        `--enable-prompt-tokens-details`, its `prompt_tokens_details.cached_tokens` too, as
        vLLM's (which leaves them out of the usage of every other chunk)."""
        cached = cached_tokens if self.enable_prompt_tokens_details else None
        return UsageInfo.of(prompt_tokens, completion_tokens, cached)

    @property
    def model_name(self) -> str:
        return self.served_model_names[0]

    def check_model(self, name: str | None) -> None:
        if name is not None and name not in self.served_model_names:
            raise OpenAIError(f"The model `{name}` does not exist.", 404, "model")

    def check_health(self) -> None:
        if not self.engine.is_running:
            raise OpenAIError("The engine is not running.", 503)

    def encode(self, prompt: "str | list[int]", add_special_tokens: bool, param: str) -> list[int]:
        """Token ids of one prompt (text or ids), checked against the vocabulary; text the
        tokenizer refuses (a lone surrogate) is a 400 naming `param`."""
        if isinstance(prompt, str):
            try:
                return self.tokenizer.encode(prompt, add_special_tokens=add_special_tokens)
            except ValueError as e:
                raise OpenAIError(f"{param}: {e}", 400, param) from None
        vocab = self.engine.config.model_config.vocab_size
        bad = [t for t in prompt if not 0 <= t < vocab]
        if bad:
            raise OpenAIError(
                f"{param} holds token ids outside [0, {vocab}): {bad[:5]}", 400, param
            )
        return list(prompt)

    def truncate(self, prompt_ids: list[int], truncate_prompt_tokens: int | None) -> list[int]:
        """The prompt tokens that run: the last `truncate_prompt_tokens` (vLLM's field; -1: the
        last max_model_len). Called before `max_tokens_for`, as upstream truncates before its
        length checks: a prompt too long for the model runs once truncated to fit. A bad value
        (0, below -1, above max_model_len) is a 400 naming the field."""
        try:
            return truncate_prompt(prompt_ids, truncate_prompt_tokens, self.max_model_len)
        except ValueError as e:
            raise OpenAIError(str(e), 400, "truncate_prompt_tokens") from None

    def max_tokens_for(
        self,
        prompt_ids: list[int],
        max_tokens: int | None,
        param: str,
        field: str = "max_tokens",
        min_tokens: object = 0,
    ) -> int:
        """Effective max_tokens: a prompt that leaves no room, or a prompt and `max_tokens` that
        together exceed `max_model_len`, is a 400, as vLLM's server refuses them (a client may
        shorten its prompt on that error rather than get a reply cut at the limit); otherwise
        it is clamped to the model's generation config's `max_new_tokens`, a server-wide limit,
        and None (chat's missing field, completions' null) is the room left (both as vLLM
        does). `field`: the
        request field `max_tokens` came from, which its errors name (chat's
        `max_completion_tokens`). A `min_tokens` that the clamping leaves no room for is a 400
        naming the cause (the sampling parameters' check would quote the clamped max_tokens,
        which the client never sent); its type is checked there."""
        limit, n = self.max_model_len, len(prompt_ids)
        if n == 0:
            raise OpenAIError(f"{param} is empty", 400, param)
        if n >= limit:
            raise OpenAIError(
                f"This model's maximum context length is {limit} tokens. However, your request "
                f"has {n} input tokens ({param}), which leaves no room for output tokens. Please "
                f"reduce the length of the {param}.",
                400,
                param,
            )
        if max_tokens is not None and not isinstance(max_tokens, bool):
            if max_tokens < 0:
                raise OpenAIError(f"{field} must be >= 0, got {max_tokens}", 400, field)
            if n + max_tokens > limit:
                raise OpenAIError(
                    f"This model's maximum context length is {limit} tokens. However, the "
                    f"request asks for {n + max_tokens} tokens: {n} in the {param} and "
                    f"{max_tokens} in the completion ({field}). Please reduce the length of the "
                    f"{param} or {field}.",
                    400,
                    field,
                )
        server_limit = self.sampling_defaults.get("max_tokens", limit)
        room = min(limit - n, server_limit)
        wanted = (
            min_tokens if isinstance(min_tokens, int) and not isinstance(min_tokens, bool) else 0
        )
        if wanted > room and (max_tokens is None or wanted <= max_tokens):
            because = (
                f"the {param}'s {n} tokens leave {limit - n} of the model's maximum context "
                f"length ({limit} tokens)"
                if room == limit - n
                else f"the server generates at most {server_limit} tokens a request"
            )
            raise OpenAIError(f"min_tokens ({wanted}) does not fit: {because}", 400, "min_tokens")
        return room if max_tokens is None else min(max_tokens, room)
