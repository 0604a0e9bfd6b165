"""`Request`: the scheduler's view of one sequence (its tokens, cache progress and status).

The prompt is kept as a tuple: a tuple of ints is one the garbage collector stops tracking,
while a list of ints is walked item by item by every collection of the generation holding it.
With 256 running requests of 1k-token prompts held as lists (twice: the prompt, and the prompt
and output together), every oldest-generation collection took ~14 ms of a decode step's host
time (docs/performance.md, "Eleventh run"). The output stays a list (it grows every step), and a
chunk of the sequence is sliced from the two (`token_ids`).
"""

import enum

from vllm.sampling_params import SamplingParams


class RequestStatus(enum.Enum):
    WAITING = enum.auto()
    RUNNING = enum.auto()
    # Evicted by recompute: holds no cache, waits to re-prefill all its tokens.
    PREEMPTED = enum.auto()
    FINISHED_STOPPED = enum.auto()
    FINISHED_LENGTH_CAPPED = enum.auto()
    FINISHED_ABORTED = enum.auto()
    FINISHED_ERROR = enum.auto()

    @property
    def is_finished(self) -> bool:
        return self in _FINISH_REASONS

    @property
    def finish_reason(self) -> str | None:
        """The OpenAI-style reason ("stop", "length", "abort", "error"); None while unfinished."""
        return _FINISH_REASONS.get(self)


_RUNNING = RequestStatus.RUNNING
_FINISH_REASONS = {
    RequestStatus.FINISHED_STOPPED: "stop",
    RequestStatus.FINISHED_LENGTH_CAPPED: "length",
    RequestStatus.FINISHED_ABORTED: "abort",
    RequestStatus.FINISHED_ERROR: "error",
}


def _is_token_id(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


class Request:
    """One sequence: prompt, sampled output and how many of its tokens are in the cache.

    `num_computed_tokens` counts the leading tokens (prompt, then output) whose MLA latents and KDA
    state are in the cache; `max_tokens` is already resolved by the engine (an int >= 1).
    """

    def __init__(
        self,
        request_id: str,
        prompt_token_ids: list[int],
        sampling_params: SamplingParams,
        eos_token_id: int | None,
        max_tokens: int,
        arrival_index: int,
    ) -> None:
        if not isinstance(request_id, str) or not request_id:
            raise ValueError(f"request_id must be a non-empty str, got {request_id!r}")
        if not isinstance(prompt_token_ids, list) or not prompt_token_ids:
            raise ValueError("prompt_token_ids must be a non-empty list of token ids")
        if not all(_is_token_id(t) for t in prompt_token_ids):
            raise ValueError("prompt_token_ids must hold non-negative integers")
        if not isinstance(sampling_params, SamplingParams):
            raise ValueError(f"sampling_params must be SamplingParams, got {sampling_params!r}")
        if eos_token_id is not None and not _is_token_id(eos_token_id):
            raise ValueError(f"eos_token_id must be None or a token id, got {eos_token_id!r}")
        if not _is_token_id(max_tokens) or max_tokens < 1:
            raise ValueError(f"max_tokens must be an integer >= 1, got {max_tokens!r}")
        if not _is_token_id(arrival_index):
            raise ValueError(f"arrival_index must be an integer >= 0, got {arrival_index!r}")
        self.request_id = request_id
        self.prompt_token_ids = tuple(prompt_token_ids)
        self.num_prompt_tokens = len(self.prompt_token_ids)
        self.sampling_params = sampling_params
        self.eos_token_id = eos_token_id
        self.max_tokens = max_tokens
        self.arrival_index = arrival_index
        self.output_token_ids: list[int] = []
        self.num_computed_tokens = 0
        self.status = RequestStatus.WAITING
        self.stop_reason: int | str | None = None
        self.num_preemptions = 0

    @property
    def num_tokens(self) -> int:
        return self.num_prompt_tokens + len(self.output_token_ids)

    def token_ids(self, start: int, end: int) -> list[int]:
        """Tokens `start` to `end` (exclusive) of the prompt followed by the output."""
        n = self.num_prompt_tokens
        if end <= n:
            return list(self.prompt_token_ids[start:end])
        if start >= n:
            return self.output_token_ids[start - n : end - n]
        return [*self.prompt_token_ids[start:], *self.output_token_ids[: end - n]]

    @property
    def is_finished(self) -> bool:
        # Checked per running request per step: `is` skips the enum's Python-level hash.
        return self.status is not _RUNNING and self.status.is_finished

    @property
    def finish_reason(self) -> str | None:
        return self.status.finish_reason

    def append_output_token_id(self, token_id: int) -> None:
        self.output_token_ids.append(token_id)

    def __repr__(self) -> str:
        return (
            f"Request({self.request_id!r}, status={self.status.name}, "
            f"tokens={self.num_tokens}, computed={self.num_computed_tokens})"
        )
