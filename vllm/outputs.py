"""What the engine returns per request: `RequestOutput` holding one `CompletionOutput` per sample
(upstream's names and fields)."""

from dataclasses import dataclass


@dataclass
class Logprob:
    """A token's log-probability, its rank among the vocabulary (1 = most likely; 1 + the number
    of strictly more likely tokens, so tied tokens share the best rank) and its text."""

    logprob: float
    rank: int | None = None
    decoded_token: str | None = None


# Per position: token id -> Logprob (the sampled/prompt token and the top-k).
PositionLogprobs = dict[int, Logprob]


@dataclass
class CompletionOutput:
    """One completion of a request.

    `finish_reason` is None while running, then "stop" (eos, a stop token or a stop string),
    "length" (`max_tokens` or `max_model_len`), "abort" or "error"; `stop_reason` is the matched
    stop string or stop token id (None for eos and the other reasons)."""

    index: int
    text: str
    token_ids: list[int]
    cumulative_logprob: float | None
    logprobs: list[PositionLogprobs] | None
    finish_reason: str | None = None
    stop_reason: int | str | None = None

    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass
class RequestOutput:
    """The state of a request after a step: its prompt and each completion so far.

    `prompt_logprobs` has one entry per prompt token, the first None (nothing predicts it)."""

    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    prompt_logprobs: list[PositionLogprobs | None] | None
    outputs: list[CompletionOutput]
    finished: bool
