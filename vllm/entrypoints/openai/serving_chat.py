"""POST /v1/chat/completions: messages rendered with the tokenizer's chat template, the reply
split into `reasoning` and `content` by the reasoning parser (if one is configured), chat-style
logprobs, and SSE streaming of deltas."""

import asyncio
import os
import time
from collections.abc import AsyncIterator

from vllm.entrypoints.openai.protocol import (
    ChatCompletionChoice,
    ChatCompletionChunk,
    ChatCompletionRequest,
    ChatCompletionResponse,
    ChatLogProb,
    ChatLogProbs,
    ChatLogProbsContent,
    ChatResponseMessage,
    ChatStreamChoice,
    DeltaMessage,
    UsageInfo,
    random_id,
)
from vllm.entrypoints.openai.serving_engine import OpenAIError, OpenAIServing, bad_request, sse
from vllm.outputs import CompletionOutput, PositionLogprobs
from vllm.reasoning import KimiK3ReasoningParser
from vllm.sampling_params import SamplingParams
from vllm.transformers_utils.chat_template import RenderingTooLong, compile_chat_template
from vllm.v1.engine.async_llm import EngineDeadError


def chat_logprobs(
    token_ids: list[int], positions: "list[PositionLogprobs]", num_top: int, tokenizer
) -> ChatLogProbs:
    """Per generated token: its text, logprob, bytes and the `num_top` most likely. `bytes` are
    the token's own (the text of one holding part of a character is U+FFFD), so that a client
    can join them into the reply's text, as OpenAI documents."""
    content = []
    for position in positions[: len(token_ids)]:
        entries = []
        for tid, lp in position.items():
            text = lp.decoded_token
            if text is None:
                text = tokenizer.decode([tid], skip_special_tokens=False)
            entries.append((tid, text, max(lp.logprob, -9999.0)))
        tid, text, logprob = entries[0]  # the sampled token comes first
        top = sorted(entries, key=lambda e: -e[2])[:num_top]
        content.append(
            ChatLogProbsContent(
                token=text,
                logprob=logprob,
                bytes=list(tokenizer.token_bytes(tid)),
                top_logprobs=[
                    ChatLogProb(token=t, logprob=v, bytes=list(tokenizer.token_bytes(i)))
                    for i, t, v in top
                ],
            )
        )
    return ChatLogProbs(content=content)


def render_messages(request: ChatCompletionRequest) -> list[dict]:
    return [m.model_dump(exclude_none=False) for m in request.messages]


# A template is a program the server runs: sandboxed, yet one can loop for as long as it likes.
UNTRUSTED_CHAT_TEMPLATE = (
    "chat_template: a request's own chat template is refused unless the server runs with "
    "--trust-request-chat-template"
)


class OpenAIServingChat(OpenAIServing):
    def __init__(
        self,
        *args,
        reasoning_parser: KimiK3ReasoningParser | None = None,
        trust_request_chat_template: bool = False,
        max_prompt_chars: int | None = None,
        **kw,
    ) -> None:
        super().__init__(*args, **kw)
        self.reasoning_parser = reasoning_parser
        self.trust_request_chat_template = trust_request_chat_template
        # The longest rendered conversation (None: no limit); the server's body limit, so that
        # a small request cannot make the server hold more than the largest body it reads.
        self.max_prompt_chars = max_prompt_chars
        # Text of each eos that may end a reply: the tokenizer's, and the model's generation
        # config's that are special tokens (Kimi's <|im_end|> beside its [EOS]).
        tokenizer = self.tokenizer
        generation = self.engine.config.model_config.generation_config
        self._eos_texts: dict[int, str] = {}
        if tokenizer is not None:
            special = set(tokenizer.all_special_ids)
            for token_id in generation.eos_token_ids:
                if token_id in special:
                    text = tokenizer.decode([token_id], skip_special_tokens=False)
                    self._eos_texts[token_id] = text
            if tokenizer.eos_token and tokenizer.eos_token_id is not None:
                self._eos_texts[tokenizer.eos_token_id] = tokenizer.eos_token

    def _template_kwargs(self, request: ChatCompletionRequest) -> dict:
        try:
            kwargs = self.tokenizer.chat_template_arguments(
                request.add_generation_prompt,
                request.chat_template_kwargs,
                request.continue_final_message,
            )
        except ValueError as e:  # names chat_template_kwargs or continue_final_message
            raise bad_request(e, ChatCompletionRequest) from None
        if request.tools:
            kwargs.setdefault("tools", request.tools)
        if request.chat_template is not None:
            if not self.trust_request_chat_template:
                raise OpenAIError(UNTRUSTED_CHAT_TEMPLATE, 400, "chat_template")
            try:  # here, so that a template that does not parse is named as the culprit
                compile_chat_template(request.chat_template)
            except ValueError as e:
                raise OpenAIError(str(e), 400, "chat_template") from None
            kwargs["chat_template"] = request.chat_template
        return kwargs

    def render(self, request: ChatCompletionRequest) -> str:
        """The prompt text of the conversation (400 naming messages if the template fails or
        its text grows past `max_prompt_chars`)."""
        kwargs = self._template_kwargs(request)
        try:
            return self.tokenizer.apply_chat_template(
                render_messages(request), tokenize=False, max_chars=self.max_prompt_chars, **kwargs
            )
        except RenderingTooLong as e:
            message = f"{e}, the most this server takes (--max-request-body-bytes)"
            raise OpenAIError(message, 400, "messages") from None
        except ValueError as e:
            raise OpenAIError(str(e), 400, "messages") from None

    def reply_role(self, request: ChatCompletionRequest) -> str:
        """The role the reply is given, as upstream names it (its `get_chat_request_role`): the
        assistant's after a generation prompt (the request's `add_generation_prompt` or its
        `chat_template_kwargs`'), else the final message's, whose turn no prompt closed: the
        reply of a continued message is the rest of it."""
        if self._template_kwargs(request)["add_generation_prompt"] or not request.messages:
            return "assistant"
        return request.messages[-1].role

    def starts_in_reasoning(self, request: ChatCompletionRequest, prompt_text: str) -> bool:
        """Whether the reply starts inside a think block that its own turn opened."""
        parser = self.reasoning_parser
        # The reply's turn ends the prompt: a prompt with no open block has none there (and most
        # prompts are settled here, without a second rendering).
        if parser is None or not parser.starts_in_reasoning(prompt_text):
            return False
        return parser.starts_in_reasoning(self.reply_turn(request, prompt_text))

    def reply_turn(self, request: ChatCompletionRequest, prompt_text: str) -> str:
        """The end of `prompt_text` that belongs to the reply's own turn: what the generation
        prompt adds after the messages or, without one, a final assistant message's rendering
        (what the prompt has beyond the same conversation rendered without it), which
        `continue_final_message` leaves open: a think block that the message opened and did not
        close is then the reply's to go on with. Only there can an open think block be the
        reply's: a marker quoted in another message, or an earlier turn's unclosed block, is not
        (all of the reply was taken for reasoning). Without a generation prompt and a final
        assistant message, or with a final message that the template closed, the reply continues
        nothing: "". A continued final message of another role (a user's text completed in the
        user's turn) is not the assistant's thinking either: "" too. With a template whose
        earlier turns render differently once a message follows, the part is longer (from where
        the renderings differ), erring towards the whole prompt; the whole prompt too if the
        shorter rendering fails."""
        kwargs = self._template_kwargs(request)
        messages = render_messages(request)
        if not kwargs["add_generation_prompt"]:
            if not messages or messages[-1].get("role") != "assistant":
                return ""
            if not kwargs["continue_final_message"] and self._closes(messages, kwargs, prompt_text):
                return ""
            messages = messages[:-1]
        # The conversation before the reply's turn, closed: there is no final message of the
        # reply's in it to continue (the one before it may not even be the assistant's).
        kwargs.update(add_generation_prompt=False, continue_final_message=False)
        try:
            base = self.tokenizer.apply_chat_template(messages, tokenize=False, **kwargs)
        except ValueError:
            return prompt_text
        if prompt_text.startswith(base):
            common = len(base)
        else:  # character by character in Python: only for templates that differ earlier
            common = len(os.path.commonprefix([prompt_text, base]))
        # A marker may have begun in the shared text (the two differ only from its middle on).
        return prompt_text[max(0, common - (len(self.reasoning_parser.start) - 1)) :]

    def _closes(self, messages: list[dict], kwargs: dict, prompt_text: str) -> bool:
        """Whether the template closed the final message in `prompt_text` (rendered without
        `continue_final_message`): it wrote something after the message (an end-of-turn token)
        that continuing the message leaves out. The reply then starts a turn of its own, outside
        any block the message left open. Continuing keeps the text's trailing spaces, which a
        template that trims the text drops: a rendering that the continued one merely extends
        wrote nothing after the message."""
        try:
            continued = self.tokenizer.apply_chat_template(
                messages, tokenize=False, **{**kwargs, "continue_final_message": True}
            )
        except ValueError:  # the message's content is not found in its rendering
            return False
        return not continued.startswith(prompt_text)

    async def create_chat_completion(
        self, request: ChatCompletionRequest
    ) -> "ChatCompletionResponse | AsyncIterator[str]":
        arrival = time.monotonic()  # the latencies count the rendering, as upstream's
        # Rendering and tokenizing a conversation of megabytes takes seconds: done on a worker
        # thread, the event loop answers other requests and /health meanwhile.
        ids, params, num_top, in_reasoning = await asyncio.to_thread(self._inputs, request)
        role = self.reply_role(request)
        request_id = random_id("chatcmpl")
        try:
            stream = await self.add_request(request_id, ids, params, arrival)
        except ValueError as e:  # refused: the engine never tracked it, nothing to abort
            raise bad_request(e, ChatCompletionRequest) from None
        if request.stream:
            return self._stream(request, request_id, stream, in_reasoning, num_top, role)
        final = None
        try:
            async for out in stream:
                final = out
        except EngineDeadError as e:
            raise OpenAIError(str(e), 503) from None
        finally:
            self.engine.abort(request_id)
        choices = []
        for c in final.outputs:
            reasoning, content = self._split(request, c, in_reasoning)
            if self.reasoning_parser is not None:
                # As upstream's parsers: a reply they take whole for reasoning has no content.
                content = content or None
            logprobs = None
            if num_top is not None:
                logprobs = chat_logprobs(c.token_ids, c.logprobs or [], num_top, self.tokenizer)
            choices.append(
                ChatCompletionChoice(
                    index=c.index,
                    message=ChatResponseMessage(
                        role=role, content=content, reasoning=reasoning or None
                    ),
                    logprobs=logprobs,
                    finish_reason=c.finish_reason,
                    stop_reason=c.stop_reason,
                )
            )
        completion = sum(len(c.token_ids) for c in final.outputs)
        usage = self.final_usage(len(final.prompt_token_ids), completion, final.num_cached_tokens)
        return ChatCompletionResponse(
            id=request_id, model=self.model_name, choices=choices, usage=usage
        )

    def _inputs(
        self, request: ChatCompletionRequest
    ) -> tuple[list[int], SamplingParams, int | None, bool]:
        """The prompt's token ids, the sampling parameters, the top logprobs each token shows
        (None: no logprobs) and whether the reply starts inside a think block; the request's
        first refused field is a 400."""
        self.check_model(request.model)
        prompt_text = self.render(request)
        ids = self.encode(prompt_text, request.add_special_tokens, "messages")
        ids = self.truncate(ids, request.truncate_prompt_tokens)
        requested, field = request.max_completion_tokens, "max_completion_tokens"
        if requested is None:
            requested, field = request.max_tokens, "max_tokens"
        max_tokens = self.max_tokens_for(ids, requested, "messages", field, request.min_tokens)
        parser = self.reasoning_parser
        skip_special = request.skip_special_tokens
        if parser is not None and parser.needs_special_tokens:
            skip_special = False
        num_top = None
        if request.logprobs:
            num_top = request.top_logprobs or 0
            # Checked here, under its own name: the engine's check would name `logprobs`.
            model_config = self.engine.config.model_config
            most = model_config.logprobs_limit
            if num_top == -1:
                # Upstream's "the whole vocabulary", held to the same limit as any count.
                vocab = model_config.vocab_size
                if vocab > most:
                    raise OpenAIError(
                        f"top_logprobs -1 asks for the whole vocabulary ({vocab} tokens), but "
                        f"this server allows at most {most} (--max-logprobs); start it with "
                        "--max-logprobs -1 to allow the whole vocabulary",
                        400,
                        "top_logprobs",
                    )
                num_top = vocab
            if not 0 <= num_top <= most:
                raise OpenAIError(
                    f"top_logprobs must be in [0, {most}] (the vocabulary and --max-logprobs), "
                    f"or -1 for the whole vocabulary, got {num_top}",
                    400,
                    "top_logprobs",
                )
        elif request.top_logprobs:
            raise OpenAIError("top_logprobs needs logprobs: true", 400, "top_logprobs")
        try:
            params = request.sampling_params(
                max_tokens,
                num_top,
                skip_special_tokens=skip_special,
                defaults=self.sampling_defaults,
            )
        except ValueError as e:
            raise bad_request(e, ChatCompletionRequest) from None
        return ids, params, num_top, self.starts_in_reasoning(request, prompt_text)

    def _split(
        self, request: ChatCompletionRequest, c: CompletionOutput, in_reasoning: bool
    ) -> tuple[str | None, str]:
        if self.reasoning_parser is None:
            return None, c.text
        text, final = c.text, c.finish_reason is not None
        if (
            self.reasoning_parser.needs_special_tokens
            and request.include_stop_str_in_output
            and c.finish_reason == "stop"
            and not isinstance(c.stop_reason, str)
            and c.token_ids
            and c.token_ids[-1] in self._eos_texts
        ):
            # Special tokens are kept for the markers' sake, so the eos that ended the reply
            # (the tokenizer's or a generation-config one) shows up in the final text; it is not
            # part of the answer. An eos text anywhere else (the model wrote one under
            # ignore_eos) is, and may have been streamed already.
            text = text.removesuffix(self._eos_texts[c.token_ids[-1]])
        reasoning, content = self.reasoning_parser.split(text, in_reasoning, final)
        return (reasoning if request.include_reasoning else None), content

    async def _stream(
        self,
        request: ChatCompletionRequest,
        request_id: str,
        stream: AsyncIterator,
        in_reasoning: bool,
        num_top: int | None,
        role: str,
    ) -> AsyncIterator[str]:
        created = int(time.time())  # one time for every chunk, as upstream and OpenAI

        def chunk(choices: list[ChatStreamChoice], usage: UsageInfo | None = None) -> str:
            # As upstream, only the fields set are written: a delta has no `"content": null`
            # beside its reasoning, no `role` after the first, a chunk no `usage` unless asked.
            fields = {"usage": usage} if usage is not None else {}
            payload = ChatCompletionChunk(
                id=request_id,
                object="chat.completion.chunk",
                created=created,
                model=self.model_name,
                choices=choices,
                **fields,
            )
            return sse(payload, exclude_unset=True)

        sent: dict[int, tuple[int, int, int]] = {}  # index -> reasoning, content, tokens sent
        done: set[int] = set()
        final = None
        try:
            async for out in stream:
                final = out
                usage = None  # the usage so far, in every chunk if asked for
                if request.continuous_usage:
                    completion = sum(len(c.token_ids) for c in out.outputs)
                    usage = UsageInfo.of(len(out.prompt_token_ids), completion)
                for c in out.outputs:
                    if c.index in done:
                        continue
                    if c.index not in sent:
                        sent[c.index] = (0, 0, 0)
                        delta = DeltaMessage(role=role, content="")
                        first = ChatStreamChoice(
                            index=c.index, delta=delta, logprobs=None, finish_reason=None
                        )
                        yield chunk([first], usage)
                    piece = self._delta(request, c, in_reasoning, sent, num_top)
                    if piece is None:
                        continue
                    if c.finish_reason is not None:
                        done.add(c.index)
                    yield chunk([piece], usage)
            if request.stream_options and request.stream_options.include_usage and final:
                completion = sum(len(c.token_ids) for c in final.outputs)
                prompt = len(final.prompt_token_ids)
                yield chunk([], self.final_usage(prompt, completion, final.num_cached_tokens))
        except EngineDeadError as e:
            yield sse(OpenAIError(str(e), 503).response())
        finally:
            self.engine.abort(request_id)
        yield sse("[DONE]")

    def _delta(
        self,
        request: ChatCompletionRequest,
        c: CompletionOutput,
        in_reasoning: bool,
        sent: dict[int, tuple[int, int, int]],
        num_top: int | None,
    ) -> ChatStreamChoice | None:
        """The next delta of completion `c` (None if nothing new is ready)."""
        finished = c.finish_reason is not None
        reasoning, content = self._split(request, c, in_reasoning)
        sent_reasoning, sent_content, sent_tokens = sent[c.index]
        new_reasoning = (reasoning or "")[sent_reasoning:]
        new_content = content[sent_content:]
        if not (new_reasoning or new_content or finished):
            return None
        sent[c.index] = (len(reasoning or ""), len(content), len(c.token_ids))
        logprobs = None
        if num_top is not None:
            logprobs = chat_logprobs(
                c.token_ids[sent_tokens:],
                (c.logprobs or [])[sent_tokens:],
                num_top,
                self.tokenizer,
            )
        # Only what this delta carries is set (the chunk is written without unset fields); the
        # last one of a reply may carry nothing: `{}`.
        parts = {"reasoning": new_reasoning, "content": new_content}
        delta = DeltaMessage(**{k: v for k, v in parts.items() if v})
        ending = {"stop_reason": c.stop_reason} if finished else {}
        return ChatStreamChoice(
            index=c.index, delta=delta, logprobs=logprobs, finish_reason=c.finish_reason, **ending
        )
