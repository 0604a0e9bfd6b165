"""POST /v1/completions: prompts in all four OpenAI forms, echo and logprobs (prompt logprobs
for loglikelihood scoring), n completions per prompt, and SSE streaming."""

import asyncio
import codecs
import time
from collections.abc import AsyncIterator

from vllm.entrypoints.openai.protocol import (
    CompletionChoice,
    CompletionLogProbs,
    CompletionRequest,
    CompletionResponse,
    UsageInfo,
    random_id,
)
from vllm.entrypoints.openai.serving_engine import (
    OpenAIError,
    OpenAIServing,
    bad_request,
    merge_streams,
    sse,
)
from vllm.outputs import CompletionOutput, PositionLogprobs, RequestOutput
from vllm.sampling_params import SamplingParams
from vllm.v1.engine.async_llm import EngineDeadError


def normalize_prompts(prompt: "str | list[str] | list[int] | list[list[int]]") -> list:
    """The request's prompts as a list of strings or token-id lists."""
    if isinstance(prompt, str):
        return [prompt]
    if not prompt:
        raise OpenAIError("prompt must not be empty", 400, "prompt")
    if isinstance(prompt[0], int):
        return [prompt]
    return list(prompt)


def _continues(prefix: bytes, byte: int) -> bool:
    """Whether `byte` goes on with `prefix`, the start of a UTF-8 character (or completes it)."""
    try:
        (prefix + bytes([byte])).decode("utf-8")
    except UnicodeDecodeError as e:
        return e.start == 0 and e.reason == "unexpected end of data"
    return True


class TextOffsets:
    """Character offsets of tokens in the text their bytes decode to. A character split across
    tokens counts once, when its last byte comes: every token of it is at its offset. (Adding up
    the lengths of the tokens' own texts counted one U+FFFD per piece, so every offset after a
    split character was too far.) One per choice, kept across the chunks of a stream."""

    def __init__(self) -> None:
        self.offset = 0
        self._decoder = codecs.getincrementaldecoder("utf-8")("replace")

    def advance(self, token_bytes: bytes) -> int:
        """The offset of a token with these bytes; moves past its complete characters."""
        at = self.offset
        unfinished = self._decoder.getstate()[0]
        if unfinished and token_bytes and not _continues(unfinished, token_bytes[0]):
            # The earlier bytes that the decoder holds end here, unfinished: their U+FFFD (one,
            # or one per byte where it held a surrogate's) come before this token's text.
            at += len(unfinished.decode("utf-8", "replace"))
        self.offset += len(self._decoder.decode(token_bytes))
        return at

    def end(self) -> int:
        """The offset of the text's end once its reply is finished: past the U+FFFD of any
        bytes the decoder still holds (an unfinished character, which the detokenizer flushes
        into the finished text)."""
        return self.offset + len(self._decoder.getstate()[0].decode("utf-8", "replace"))


def completion_logprobs(
    token_ids: list[int],
    positions: "list[PositionLogprobs | None]",
    tokenizer,
    offsets: TextOffsets | None = None,
    reply_from: int | None = None,
    finished: bool = False,
) -> CompletionLogProbs:
    """OpenAI's legacy logprobs: per token its text, logprob (None where nothing predicts it),
    the top alternatives {text: logprob}, and its character offset. `reply_from`: where the
    tokens of a reply detokenized with skip_special_tokens begin; its special tokens are not in
    its text, so they take no room there (an echoed prompt's are). `finished`: the tokens end
    the reply, so those after its last byte (a final eos the text leaves out) are at the text's
    end, after an unfinished last character's U+FFFD."""
    offsets = offsets or TextOffsets()
    result = CompletionLogProbs()
    bytes_of: list[bytes] = []
    for i, (token, position) in enumerate(zip(token_ids, positions, strict=True)):
        if position is None or token not in position:
            text = tokenizer.decode([token], skip_special_tokens=False)
            result.tokens.append(text)
            result.token_logprobs.append(None)
            result.top_logprobs.append(None)
        else:
            entry = position[token]
            text = entry.decoded_token
            if text is None:
                text = tokenizer.decode([token], skip_special_tokens=False)
            result.tokens.append(text)
            result.token_logprobs.append(max(entry.logprob, -9999.0))
            # Keyed by text, so tokens that decode alike (bytes of a split character, all "\ufffd")
            # share an entry: it holds the most likely one's logprob. The sampled token comes
            # first; had it kept the entry, a likelier token with the same text would vanish and
            # the sampled one look greedy (lm_eval's is_greedy: logprob == max(top_logprobs)).
            top: dict[str, float] = {}
            for tid, lp in position.items():
                key = lp.decoded_token
                if key is None:
                    key = tokenizer.decode([tid], skip_special_tokens=False)
                value = max(lp.logprob, -9999.0)
                if value > top.get(key, float("-inf")):
                    top[key] = value
            result.top_logprobs.append(top)
        in_text = reply_from is None or i < reply_from or not tokenizer.is_special(token)
        token_bytes = tokenizer.token_bytes(token) if in_text else b""
        bytes_of.append(token_bytes)
        result.text_offset.append(offsets.advance(token_bytes))
    if finished:
        i = len(bytes_of) - 1
        while i >= 0 and not bytes_of[i]:
            result.text_offset[i] = offsets.end()
            i -= 1
    return result


class OpenAIServingCompletion(OpenAIServing):
    async def create_completion(
        self, request: CompletionRequest
    ) -> "CompletionResponse | AsyncIterator[str]":
        """The response, or for `stream` the SSE events (after the requests were accepted)."""
        arrival = time.monotonic()  # the latencies count the tokenization, as upstream's
        # A prompt of megabytes takes seconds to tokenize (or, as ids, to check and decode):
        # done on a worker thread, the event loop answers other requests and /health meanwhile.
        inputs = await asyncio.to_thread(self._inputs, request)
        request_id = random_id("cmpl")
        ids_of = [f"{request_id}-{i}" for i in range(len(inputs))]
        streams = []
        try:
            for rid, (ids, _, params) in zip(ids_of, inputs, strict=True):
                streams.append(await self.add_request(rid, ids, params, arrival))
        except ValueError as e:
            self._abort(ids_of)
            raise bad_request(e, CompletionRequest) from None
        except BaseException:
            self._abort(ids_of)
            raise
        prompt_texts = [text for _, text, _ in inputs]
        if request.stream:
            prompt_total = sum(len(ids) for ids, _, _ in inputs)
            return self._stream(request, request_id, ids_of, streams, prompt_texts, prompt_total)
        try:
            finals: dict[int, RequestOutput] = {}
            async for i, out in merge_streams(streams):
                if out.finished:
                    finals[i] = out
        except EngineDeadError as e:
            raise OpenAIError(str(e), 503) from None
        finally:
            self._abort(ids_of)
        # With echo and logprobs every prompt token is detokenized, one by one: a worker thread's
        # job too for a long prompt.
        return await asyncio.to_thread(self._response, request, request_id, finals, prompt_texts)

    def _response(
        self,
        request: CompletionRequest,
        request_id: str,
        finals: dict[int, RequestOutput],
        prompt_texts: list[str],
    ) -> CompletionResponse:
        choices, prompt_tokens, completion_tokens, cached_tokens = [], 0, 0, 0
        for i, text in enumerate(prompt_texts):
            out = finals[i]
            prompt_tokens += len(out.prompt_token_ids)
            cached_tokens += out.num_cached_tokens
            for c in out.outputs:
                completion_tokens += len(c.token_ids)
                choices.append(self._choice(request, i, out, c, text))
        usage = self.final_usage(prompt_tokens, completion_tokens, cached_tokens)
        return CompletionResponse(
            id=request_id, model=self.model_name, choices=choices, usage=usage
        )

    def _inputs(self, request: CompletionRequest) -> list[tuple[list[int], str, SamplingParams]]:
        """Each prompt's token ids (truncated: `truncate_prompt_tokens`), its text as echo shows
        it and its sampling parameters; the request's first refused field is a 400."""
        self.check_model(request.model)
        if request.suffix:
            raise OpenAIError("suffix is not supported", 400, "suffix")
        if request.best_of not in (None, request.n):
            message = f"best_of is not supported (only null or n), got {request.best_of}"
            raise OpenAIError(message, 400, "best_of")
        if request.logprobs is not None and request.logprobs < 0:
            # SamplingParams takes -1 (the whole vocabulary, upstream's LLM API); as upstream,
            # this endpoint does not: chat's top_logprobs does.
            message = f"logprobs must be >= 0, got {request.logprobs}"
            raise OpenAIError(message, 400, "logprobs")
        inputs = []
        for prompt in normalize_prompts(request.prompt):
            encoded = self.encode(prompt, request.add_special_tokens, "prompt")
            ids = self.truncate(encoded, request.truncate_prompt_tokens)
            max_tokens = self.max_tokens_for(
                ids, request.max_tokens, "prompt", min_tokens=request.min_tokens
            )
            prompt_logprobs = request.logprobs if request.echo else None
            try:
                params = request.sampling_params(
                    max_tokens, request.logprobs, prompt_logprobs, defaults=self.sampling_defaults
                )
            except ValueError as e:
                raise bad_request(e, CompletionRequest) from None
            text = prompt
            # Echo shows the prompt that ran: the text of the kept tokens once truncated.
            if not isinstance(prompt, str) or len(ids) < len(encoded):
                text = self.tokenizer.decode(ids, skip_special_tokens=False) if request.echo else ""
            inputs.append((ids, text, params))
        return inputs

    def _abort(self, request_ids: list[str]) -> None:
        for rid in request_ids:
            self.engine.abort(rid)

    def _choice(
        self,
        request: CompletionRequest,
        prompt_index: int,
        out: RequestOutput,
        c: CompletionOutput,
        prompt_text: str,
    ) -> CompletionChoice:
        text, logprobs = c.text, None
        if request.echo:
            text = prompt_text + text
        if request.logprobs is not None:
            logprobs = self._logprobs(request, out, c, request.echo)
        return CompletionChoice(
            index=prompt_index * request.n + c.index,
            text=text,
            logprobs=logprobs,
            finish_reason=c.finish_reason,
            stop_reason=c.stop_reason,
        )

    def _logprobs(
        self,
        request: CompletionRequest,
        out: RequestOutput,
        c: CompletionOutput,
        with_prompt: bool,
        start: int = 0,
        offsets: TextOffsets | None = None,
    ) -> CompletionLogProbs:
        tokens: list[int] = []
        positions: list = []
        if with_prompt:
            tokens += out.prompt_token_ids
            prompt_positions = out.prompt_logprobs or []
            positions += prompt_positions + [None] * (len(tokens) - len(prompt_positions))
        generated = c.token_ids[start:]
        reply_from = len(tokens) if request.skip_special_tokens else None
        tokens += generated
        positions += (c.logprobs or [])[start : start + len(generated)]
        positions += [None] * (len(tokens) - len(positions))
        finished = c.finish_reason is not None
        return completion_logprobs(tokens, positions, self.tokenizer, offsets, reply_from, finished)

    async def _stream(
        self,
        request: CompletionRequest,
        request_id: str,
        request_ids: list[str],
        streams: list,
        prompt_texts: list[str],
        prompt_total: int,
    ) -> AsyncIterator[str]:
        n = request.n
        sent_text: dict[int, int] = {}
        sent_tokens: dict[int, int] = {}
        text_offsets: dict[int, TextOffsets] = {}
        done: set[int] = set()
        prompt_tokens: dict[int, int] = {}
        cached_tokens: dict[int, int] = {}
        completion_tokens: dict[int, int] = {}
        created = int(time.time())  # one time for every chunk, as upstream and OpenAI
        try:
            async for i, out in merge_streams(streams):
                prompt_tokens[i] = len(out.prompt_token_ids)
                cached_tokens[i] = out.num_cached_tokens
                for c in out.outputs:
                    index = i * n + c.index
                    if index in done:
                        continue
                    completion_tokens[index] = len(c.token_ids)
                    first = index not in sent_text
                    delta = c.text[sent_text.get(index, 0) :]
                    if not delta and c.finish_reason is None and not (first and request.echo):
                        continue
                    logprobs = None
                    if request.logprobs is not None:
                        with_prompt = request.echo and first
                        args = (request, out, c, with_prompt, sent_tokens.get(index, 0))
                        offsets = text_offsets.setdefault(index, TextOffsets())
                        if with_prompt:  # every prompt token: a worker thread's job, as above
                            logprobs = await asyncio.to_thread(self._logprobs, *args, offsets)
                        else:
                            logprobs = self._logprobs(*args, offsets)
                    sent_tokens[index] = len(c.token_ids)
                    sent_text[index] = len(c.text)
                    text = prompt_texts[i] + delta if first and request.echo else delta
                    if c.finish_reason is not None:
                        done.add(index)
                    choice = CompletionChoice(
                        index=index,
                        text=text,
                        logprobs=logprobs,
                        finish_reason=c.finish_reason,
                        stop_reason=c.stop_reason,
                    )
                    usage = None
                    if request.continuous_usage:
                        usage = UsageInfo.of(prompt_total, sum(completion_tokens.values()))
                    yield sse(
                        CompletionResponse(
                            id=request_id, created=created, model=self.model_name,
                            choices=[choice], usage=usage,
                        )
                    )  # fmt: skip
            if request.stream_options and request.stream_options.include_usage:
                usage = self.final_usage(
                    sum(prompt_tokens.values()),
                    sum(completion_tokens.values()),
                    sum(cached_tokens.values()),
                )
                # Without its None fields, as upstream writes this chunk: no
                # `prompt_tokens_details` unless the server reports them.
                yield sse(
                    CompletionResponse(
                        id=request_id, created=created, model=self.model_name, choices=[],
                        usage=usage,
                    ),
                    exclude_none=True,
                )  # fmt: skip
        except EngineDeadError as e:
            yield sse(OpenAIError(str(e), 503).response())
        finally:
            self._abort(request_ids)
        yield sse("[DONE]")
