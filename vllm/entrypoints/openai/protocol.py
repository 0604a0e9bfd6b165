"""Request and response bodies of the OpenAI-compatible API (the fields vLLM serves).

Requests accept and ignore unknown fields (a warning is logged), as vLLM does; a field of the wrong
type is refused by pydantic and reported as a 400 naming it. An explicit `null` for an optional
field means its default (the OpenAI reference has `n`, `stream`, `echo`, chat `logprobs`, ... as
"integer/boolean or null"; some clients send every field, unset ones as null). Value checks
(ranges) are left to `SamplingParams`, whose errors also name the field. Sampling knobs the engine
lacks (`presence_penalty`, `frequency_penalty`, `logit_bias`) are refused unless they change
nothing, and so are the fields of vLLM's request schema that this server does not implement
(`UNIMPLEMENTED_FIELDS`): a client written for vLLM that sends one gets a 400 naming it, not a
reply that silently disobeys it.
"""

import time
import types
import typing
import uuid
from typing import Any, ClassVar, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    TypeAdapter,
    ValidationError,
    ValidatorFunctionWrapHandler,
    field_validator,
    model_validator,
)

from vllm.sampling_params import SamplingParams

# Completions per prompt a request may ask for. The engine builds every one as a sequence of its
# own when the request is added: an unbounded `n` (say 2**62) made one request allocate until the
# server was killed for memory, taking every other client with it.
MAX_N = 128
# The largest request body the server reads (`vllm serve --max-request-body-bytes`): with none, a
# client could make it hold any amount. A million-token prompt is at most about 10 MB of JSON (as
# text with every character escaped, or as token ids), so this leaves room for long contexts and
# batched prompts.
DEFAULT_MAX_REQUEST_BODY_BYTES = 32 * 1024 * 1024


# Fields of vLLM's completion and chat requests (its "extra parameters") that would change the
# reply and are not implemented here, with the values that change nothing. They are not declared
# below, so pydantic keeps them as extra fields, which `SamplingFields.refuse_unimplemented` checks.
# (`length_penalty` is beam search's, refused anyway; `spaces_between_special_tokens` changes
# nothing with these tokenizers: sampling_params.py.)
UNIMPLEMENTED_FIELDS: dict[str, tuple[Any, ...]] = {
    "use_beam_search": (None, False),
    "allowed_token_ids": (None, []),
    "bad_words": (None, []),
    "prompt_logprobs": (None,),
    "return_tokens_as_token_ids": (None, False),
    "return_token_ids": (None, False),
    "logits_processors": (None, []),
    "structured_outputs": (None,),
    "guided_json": (None,),
    "guided_regex": (None,),
    "guided_choice": (None,),
    "guided_grammar": (None,),
    "priority": (None, 0),
}
# Completions' own: `prompt_embeds` stand for the prompt.
UNIMPLEMENTED_COMPLETION_FIELDS: dict[str, tuple[Any, ...]] = {
    **UNIMPLEMENTED_FIELDS,
    "prompt_embeds": (None,),
}
# Chat's own: a `tool_choice` of "required" or a named function makes the reply a tool call,
# which needs a tool-call parser this server lacks ("auto", like leaving it out, lets the model
# answer in text: `tools` only reach the chat template); `echo` prepends the last message to a
# reply of its role; `documents` reach vLLM's chat template.
UNIMPLEMENTED_CHAT_FIELDS: dict[str, tuple[Any, ...]] = {
    **UNIMPLEMENTED_FIELDS,
    "tool_choice": (None, "none", "auto"),
    "echo": (None, False),
    "documents": (None, []),
}


def random_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


def _takes_none(annotation: Any) -> bool:
    if annotation is None or annotation is type(None) or annotation is Any:
        return True
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        return any(_takes_none(a) for a in typing.get_args(annotation))
    return False


class OpenAIModel(BaseModel):
    model_config = ConfigDict(extra="allow")

    @model_validator(mode="before")
    @classmethod
    def _null_means_default(cls, data: Any) -> Any:
        """`"n": null` is `n` left out, for an optional field that has no null of its own (where
        null has a meaning, e.g. completions' `max_tokens`: no limit, it is kept)."""
        if not isinstance(data, dict):
            return data
        fields = cls.model_fields
        return {
            k: v
            for k, v in data.items()
            if not (
                v is None
                and k in fields
                and not fields[k].is_required()
                and not _takes_none(fields[k].annotation)
            )
        }


class ErrorInfo(BaseModel):
    message: str
    type: str
    param: str | None = None
    code: int


class ErrorResponse(BaseModel):
    error: ErrorInfo


class StreamOptions(OpenAIModel):
    include_usage: bool = False
    continuous_usage_stats: bool = False


class PromptTokenUsageInfo(BaseModel):
    cached_tokens: int | None = None


class UsageInfo(BaseModel):
    prompt_tokens: int = 0
    completion_tokens: int = 0
    total_tokens: int = 0
    # vLLM's, set only with `--enable-prompt-tokens-details` (`OpenAIServing.final_usage`).
    prompt_tokens_details: PromptTokenUsageInfo | None = None

    @classmethod
    def of(
        cls, prompt_tokens: int, completion_tokens: int, cached_tokens: int | None = None
    ) -> "UsageInfo":
        """The usage; with `cached_tokens` (the prompt tokens whose KV came from a cache), its
        `prompt_tokens_details` too. Left unset otherwise, so that a chunk written without its
        unset fields leaves it out, as vLLM's do."""
        details = {}
        if cached_tokens is not None:
            details["prompt_tokens_details"] = PromptTokenUsageInfo(cached_tokens=cached_tokens)
        return cls(
            prompt_tokens=prompt_tokens,
            completion_tokens=completion_tokens,
            total_tokens=prompt_tokens + completion_tokens,
            **details,
        )


class SamplingFields(OpenAIModel):
    """Sampling fields shared by completions and chat completions."""

    unimplemented_fields: ClassVar[dict[str, tuple[Any, ...]]] = UNIMPLEMENTED_FIELDS

    model: str | None = None
    n: int = 1
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    seed: int | None = None
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    ignore_eos: bool = False
    include_stop_str_in_output: bool = False
    min_tokens: int = 0
    repetition_penalty: float | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    # OpenAI fields that change the output and are not implemented: refused when they would
    # matter, rather than ignored like unknown fields (a reply that silently disobeys them).
    logit_bias: dict[str, float] | None = None
    response_format: dict[str, Any] | None = None
    skip_special_tokens: bool = True
    # vLLM's: the last k prompt tokens only (-1: the last max_model_len). The server truncates
    # before its length checks (`OpenAIServing.truncate`); the sampling parameters carry it too.
    truncate_prompt_tokens: int | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    user: str | None = None  # sent by some OpenAI clients; unused

    @property
    def continuous_usage(self) -> bool:
        """Whether every streamed chunk carries the usage so far (vLLM's
        `stream_options.continuous_usage_stats`, with `include_usage`)."""
        options = self.stream_options
        return bool(options and options.include_usage and options.continuous_usage_stats)

    def refuse_unimplemented(self) -> None:
        """Raises ValueError naming the first field of `unimplemented_fields` that the request
        sets to a value that would change the reply."""
        for name, value in (self.model_extra or {}).items():
            neutral = self.unimplemented_fields.get(name)
            if neutral is not None and value not in neutral:
                raise ValueError(
                    f"{name} is not supported by this server (it takes only "
                    f"{' or '.join(repr(v) for v in neutral)}; leave it out)"
                )

    def sampling_params(
        self,
        max_tokens: int,
        logprobs: int | None,
        prompt_logprobs: int | None = None,
        skip_special_tokens: bool | None = None,
        defaults: dict[str, Any] | None = None,
    ) -> SamplingParams:
        """Engine parameters; raises ValueError naming a field that is out of range. `defaults`
        (the model's generation config) stand in for the sampling fields the request leaves
        null or out; vLLM's defaults for the rest."""
        defaults = defaults or {}
        self.refuse_unimplemented()

        def knob(name: str, vllm_default: float) -> float:
            value = getattr(self, name)
            return defaults.get(name, vllm_default) if value is None else value

        if isinstance(self.n, int) and self.n > MAX_N:
            raise ValueError(f"n must be <= {MAX_N}, got {self.n}")
        if self.stream_options is not None and not self.stream:
            # As OpenAI and vLLM: the options of a stream that the request does not ask for.
            raise ValueError("stream_options is only allowed when stream is true")
        if self.response_format and self.response_format.get("type", "text") != "text":
            kind = self.response_format.get("type")
            raise ValueError(f"response_format {kind!r} is not supported (only 'text')")
        return SamplingParams(
            n=self.n,
            temperature=knob("temperature", 1.0),
            top_p=knob("top_p", 1.0),
            top_k=knob("top_k", 0),
            min_p=knob("min_p", 0.0),
            seed=self.seed,
            max_tokens=max_tokens,
            min_tokens=self.min_tokens,
            stop=self.stop,
            stop_token_ids=self.stop_token_ids,
            ignore_eos=self.ignore_eos,
            include_stop_str_in_output=self.include_stop_str_in_output,
            logprobs=logprobs,
            prompt_logprobs=prompt_logprobs,
            repetition_penalty=knob("repetition_penalty", 1.0),
            # Taken at the values that change nothing; SamplingParams refuses others by name.
            presence_penalty=self.presence_penalty or 0.0,
            frequency_penalty=self.frequency_penalty or 0.0,
            logit_bias=self.logit_bias,
            skip_special_tokens=(
                self.skip_special_tokens if skip_special_tokens is None else skip_special_tokens
            ),
            truncate_prompt_tokens=self.truncate_prompt_tokens,
        )


# -- /v1/completions ---------------------------------------------------------------------------


class CompletionRequest(SamplingFields):
    unimplemented_fields: ClassVar[dict[str, tuple[Any, ...]]] = UNIMPLEMENTED_COMPLETION_FIELDS

    prompt: list[int] | list[list[int]] | str | list[str]
    max_tokens: int | None = 16
    echo: bool = False
    logprobs: int | None = None
    add_special_tokens: bool = True
    suffix: str | None = None
    best_of: int | None = None  # refused unless it changes nothing (null or n)

    @field_validator("prompt", mode="wrap")
    @classmethod
    def _one_kind_of_list(cls, value: Any, handler: ValidatorFunctionWrapHandler) -> Any:
        """A list prompt is checked as the one form its items say it is. Pydantic tries every form
        of the union, and the server reports the first error, which is the first form's: `["a",
        1]` was told that `"a"` is no valid integer. Only a prompt the union refuses is looked
        at again (item by item in Python: on the event loop, 7 times the union's own time for a
        valid prompt of a million token ids)."""
        try:
            return handler(value)
        except ValidationError:
            if not isinstance(value, list) or not value:
                raise
        kinds = [_prompt_item_kind(item) for item in value]
        for i, kind in enumerate(kinds):
            if kind != kinds[0]:
                raise ValueError(
                    "a list prompt holds only strings, only token ids or only lists of token "
                    f"ids: item 0 is {kinds[0]}, item {i} {kind}"
                )
        try:
            _PROMPT_LIST_FORMS[kinds[0]].validate_python(value)
        except ValidationError as e:
            first = e.errors()[0]
            where = ".".join(str(part) for part in first["loc"])
            raise ValueError(f"item {where}: {first['msg']}") from None
        return handler(value)  # not reached: the form alone took what the union refused


def _prompt_item_kind(item: Any) -> str:
    if isinstance(item, str):
        return "a string"
    return "a list" if isinstance(item, list) else "a token id"


_PROMPT_LIST_FORMS: dict[str, TypeAdapter] = {
    "a string": TypeAdapter(list[str]),
    "a token id": TypeAdapter(list[int]),
    "a list": TypeAdapter(list[list[int]]),
}


class CompletionLogProbs(BaseModel):
    text_offset: list[int] = Field(default_factory=list)
    token_logprobs: list[float | None] = Field(default_factory=list)
    tokens: list[str] = Field(default_factory=list)
    top_logprobs: list[dict[str, float] | None] = Field(default_factory=list)


class CompletionChoice(BaseModel):
    index: int
    text: str
    logprobs: CompletionLogProbs | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None


class CompletionResponse(BaseModel):
    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    choices: list[CompletionChoice]
    usage: UsageInfo | None = None


# -- /v1/chat/completions ----------------------------------------------------------------------


class ChatMessage(OpenAIModel):
    role: str
    content: str | list[dict[str, Any]] | None = None


class FunctionDefinition(OpenAIModel):
    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None


class ChatTool(OpenAIModel):
    """A tool as OpenAI's and vLLM's requests declare one: a function, its name required."""

    type: Literal["function"] = "function"
    function: FunctionDefinition


_TOOLS = TypeAdapter(list[ChatTool])


def check_tools(tools: list[dict[str, Any]] | None) -> list[dict[str, Any]] | None:
    """`tools` as given, once each is a tool (`ChatTool`), as vLLM's request schema refuses any
    other; a ValueError naming the first bad one otherwise. The dicts themselves reach the chat
    template, so that it renders what the client sent (no defaults filled in)."""
    if tools is not None:
        try:
            _TOOLS.validate_python(tools)
        except ValidationError as e:
            first = e.errors()[0]
            where = ".".join(str(part) for part in first["loc"])
            raise ValueError(f"tool {where}: {first['msg']}") from None
    return tools


class ChatCompletionRequest(SamplingFields):
    unimplemented_fields: ClassVar[dict[str, tuple[Any, ...]]] = UNIMPLEMENTED_CHAT_FIELDS

    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: int | None = None
    max_completion_tokens: int | None = None
    logprobs: bool = False
    top_logprobs: int | None = None
    add_generation_prompt: bool = True
    continue_final_message: bool = False  # the final message left open, in its own role
    chat_template: str | None = None  # refused unless --trust-request-chat-template
    chat_template_kwargs: dict[str, Any] | None = None
    include_reasoning: bool = True
    tools: list[dict[str, Any]] | None = None  # passed to the chat template; no tool parser
    add_special_tokens: bool = False  # vLLM's: the tokenizer's own (BOS) on top of the template's

    @field_validator("tools")
    @classmethod
    def _tools_are_tools(cls, tools: list[dict[str, Any]] | None) -> list[dict[str, Any]] | None:
        return check_tools(tools)


class ChatLogProb(BaseModel):
    token: str
    logprob: float
    bytes: list[int] | None = None


class ChatLogProbsContent(ChatLogProb):
    top_logprobs: list[ChatLogProb] = Field(default_factory=list)


class ChatLogProbs(BaseModel):
    content: list[ChatLogProbsContent] | None = None


class ChatResponseMessage(BaseModel):
    role: str = "assistant"
    content: str | None = None
    reasoning: str | None = None


class ChatCompletionChoice(BaseModel):
    index: int
    message: ChatResponseMessage
    logprobs: ChatLogProbs | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None


class ChatCompletionResponse(BaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    choices: list[ChatCompletionChoice]
    usage: UsageInfo


class DeltaMessage(BaseModel):
    role: str | None = None
    content: str | None = None
    reasoning: str | None = None


class ChatStreamChoice(BaseModel):
    index: int
    delta: DeltaMessage
    logprobs: ChatLogProbs | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None


class ChatCompletionChunk(BaseModel):
    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    choices: list[ChatStreamChoice]
    usage: UsageInfo | None = None


# -- tokenizer endpoints -------------------------------------------------------------------------


class TokenizeRequest(OpenAIModel):
    model: str | None = None
    prompt: str | None = None
    # At least one, as for chat: an empty list got past here and failed as a 500 when the chat
    # request was built from it.
    messages: list[ChatMessage] | None = Field(default=None, min_length=1)
    add_special_tokens: bool = True
    add_generation_prompt: bool = True
    continue_final_message: bool = False  # as for chat
    chat_template: str | None = None  # as for chat
    chat_template_kwargs: dict[str, Any] | None = None
    tools: list[dict[str, Any]] | None = None  # passed to the chat template, as for chat
    return_token_strs: bool = False

    @field_validator("tools")
    @classmethod
    def _tools_are_tools(cls, tools: list[dict[str, Any]] | None) -> list[dict[str, Any]] | None:
        return check_tools(tools)


class TokenizeResponse(BaseModel):
    count: int
    max_model_len: int
    tokens: list[int]
    token_strs: list[str] | None = None


class DetokenizeRequest(OpenAIModel):
    model: str | None = None
    tokens: list[int]


class DetokenizeResponse(BaseModel):
    prompt: str


# -- /v1/models ----------------------------------------------------------------------------------


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int = Field(default_factory=lambda: int(time.time()))
    owned_by: str = "vllm"
    root: str
    parent: str | None = None
    max_model_len: int
    permission: list[dict[str, Any]] = Field(default_factory=list)


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]
