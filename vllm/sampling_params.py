"""`SamplingParams`: how one request is sampled and when it stops (upstream's names and defaults).

Every field is validated at construction; a bad value raises `ValueError` naming the field, so a
bad request is refused when it is added, never in the middle of a step.
"""

import math
import numbers
from dataclasses import dataclass, field
from enum import IntEnum

# Below this a temperature means greedy (argmax), as upstream.
_GREEDY_EPS = 1e-5
# The sampler applies temperature and repetition_penalty in float32: a value that would round to
# 0 or overflow to infinity there would make the probabilities NaN.
_FLOAT32_MAX = 3.4028234663852886e38
_FLOAT32_TINY = 1.1754943508222875e-38  # the smallest normal float32
# What torch's generators take (`manual_seed`): int64 or uint64 values.
SEED_MIN, SEED_MAX = -(2**63), 2**64 - 1


class SamplingType(IntEnum):
    GREEDY = 0
    RANDOM = 1
    RANDOM_SEED = 2


class RequestOutputKind(IntEnum):
    """Which steps return a request's output: every step that changed it (cumulative: the text and
    tokens so far, for streaming), or only the step that finished it (`LLM.generate`, which reads
    nothing else, so the engine does not build an output per request per step for it)."""

    # Upstream's values; its DELTA (1) is not supported.
    CUMULATIVE = 0
    FINAL_ONLY = 2


@dataclass
class SamplingParams:
    """Sampling and stopping of one request.

    - `n`: completions per prompt (each its own sequence; with a `seed`, completion i uses
      `seed + i`).
    - `temperature` (0: greedy), `top_k` (0 or -1: off), `top_p` (1: off), `min_p` (0: off).
    - `seed`: per-request generator: the same seed gives the same tokens whatever else is batched.
    - `max_tokens` (None: up to `max_model_len`), `min_tokens` (eos and `stop_token_ids` are
      suppressed, and stop strings ending in the text of those tokens ignored, before it).
    - `stop` strings (matched in the detokenized text, across token boundaries; of several that
      match in one step, the one starting first in the text), `stop_token_ids`,
      `ignore_eos`. The matched stop string, or the text of the stop token (eos included), is left
      out of the text unless `include_stop_str_in_output`; a stop token stays in the token ids.
    - `logprobs`: number of top logprobs per sampled token (0: only the sampled one);
      `prompt_logprobs`: the same for each prompt token. -1 asks for the whole vocabulary, as
      upstream: the engine takes it as the vocabulary size, which it allows only where its
      `max_logprobs` is -1 (or at least that size), the limit any count is held to. A bool is
      taken as the count it stands for (True: 1, False: 0), as upstream takes it.
    - `repetition_penalty` (1: off; > 1 discourages tokens already in the prompt or output).
    - `detokenize` (False: the outputs carry token ids only: their text is empty, their logprobs'
      `decoded_token` None, and nothing of the request is decoded, which saves the engine
      thread's time for callers that read ids; stop strings, matched in the text, are refused
      with it, as upstream).
    - `skip_special_tokens`: detokenization. `spaces_between_special_tokens` is taken for
      upstream's API only: it is an option of upstream's slow tokenizers, and the `tokenizers`
      and tiktoken decoders used here have none, so it changes nothing.
    - `truncate_prompt_tokens`: run on the last k tokens of the prompt only (left truncation, as
      upstream; -1: the last `max_model_len`; None: the whole prompt), applied before the
      prompt's length is checked. A k above `max_model_len` is refused when the request is added
      (`truncate_prompt`).
    - `output_kind`: see `RequestOutputKind`.
    - Upstream's `presence_penalty`, `frequency_penalty` (0), `logit_bias` (None or all 0),
      `allowed_token_ids`, `bad_words` and `logits_processors` (None or empty) are taken only at
      values that change nothing; others are a ValueError naming the field. `logit_bias` keys
      must be token ids (ints, or strings of them, as upstream reads them), in the vocabulary
      (checked by the engine).
    """

    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    seed: int | None = None
    max_tokens: int | None = 16
    min_tokens: int = 0
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    ignore_eos: bool = False
    include_stop_str_in_output: bool = False
    logprobs: int | None = None
    prompt_logprobs: int | None = None
    repetition_penalty: float = 1.0
    detokenize: bool = True
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True
    truncate_prompt_tokens: int | None = None
    output_kind: RequestOutputKind = RequestOutputKind.CUMULATIVE
    # Upstream's fields that this engine does not implement, taken at the values that change
    # nothing (so that upstream code passing them runs as it did) and refused by name otherwise.
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    logit_bias: dict[int, float] | dict[str, float] | None = None  # OpenAI's keys are strings
    allowed_token_ids: list[int] | None = None
    bad_words: list[str] | None = None
    # Upstream's V1 engine refuses any too; the field is taken so that code passing None runs.
    logits_processors: list | None = None
    # Filled by the engine: the full stop-token set (stop_token_ids, the tokenizer's eos and the
    # model's generation-config eos ids).
    all_stop_token_ids: set[int] = field(default_factory=set, init=False, repr=False)

    def __post_init__(self) -> None:
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        # Only lists and tuples: list() of an int raises TypeError, and of a dict or set it would
        # silently take the keys or an arbitrary order.
        if self.stop is not None and not isinstance(self.stop, list | tuple):
            raise ValueError(f"stop must be a string or a list of strings, got {self.stop!r}")
        if self.stop_token_ids is not None and not isinstance(self.stop_token_ids, list | tuple):
            raise ValueError(
                f"stop_token_ids must be a list of token ids, got {self.stop_token_ids!r}"
            )
        self.stop = list(self.stop or [])
        ids = list(self.stop_token_ids or [])
        converted = as_token_ids(ids)
        self.stop_token_ids = ids if converted is None else converted  # bad ids: checked below
        self._check_int("n", self.n, 1)
        self._check_number("temperature", self.temperature, 0.0, _FLOAT32_MAX)
        self._check_number("top_p", self.top_p)
        if not 0.0 < self.top_p <= 1.0:  # one message for 0 (keeps no token) and out of range
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        self._check_int("top_k", self.top_k, -1)
        self._check_number("min_p", self.min_p, 0.0, 1.0)
        if self.seed is not None:
            # Completion i of n uses seed + i.
            self._check_int("seed", self.seed, SEED_MIN, SEED_MAX - (self.n - 1))
        if self.max_tokens is not None:
            self._check_int("max_tokens", self.max_tokens, 0)
        self._check_int("min_tokens", self.min_tokens, 0)
        if self.max_tokens is not None and self.min_tokens > self.max_tokens:
            raise ValueError(
                f"min_tokens ({self.min_tokens}) must be <= max_tokens ({self.max_tokens})"
            )
        for s in self.stop:
            if not isinstance(s, str) or not s:
                raise ValueError(f"stop must hold non-empty strings, got {s!r}")
        if self.truncate_prompt_tokens is not None:
            check_truncate_prompt_tokens(self.truncate_prompt_tokens)
        for t in self.stop_token_ids:
            self._check_int("stop_token_ids", t, 0)
        # Upstream turns True into 1 and keeps False, which every use of the count there takes
        # as 0 (the sampled token's logprob alone). Both become those ints here, so that the
        # integer checks below and the engine see a count, never a bool.
        if isinstance(self.logprobs, bool):
            self.logprobs = int(self.logprobs)
        if isinstance(self.prompt_logprobs, bool):
            self.prompt_logprobs = int(self.prompt_logprobs)
        # -1: the whole vocabulary, which only the engine knows (`resolve_logprobs`).
        if self.logprobs is not None:
            self._check_int("logprobs", self.logprobs, -1)
        if self.prompt_logprobs is not None:
            self._check_int("prompt_logprobs", self.prompt_logprobs, -1)
        self._check_number(
            "repetition_penalty", self.repetition_penalty, _FLOAT32_TINY, _FLOAT32_MAX
        )
        for name in (
            "ignore_eos",
            "include_stop_str_in_output",
            "detokenize",
            "skip_special_tokens",
            "spaces_between_special_tokens",
        ):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name} must be a bool, got {getattr(self, name)!r}")
        if self.stop and not self.detokenize:
            # Stop strings are matched in the text, which such a request does not have.
            raise ValueError("stop strings need detokenize=True (they are matched in the text)")
        if not isinstance(self.output_kind, RequestOutputKind):
            raise ValueError(f"output_kind must be a RequestOutputKind, got {self.output_kind!r}")
        self._check_unsupported()
        if self.temperature < _GREEDY_EPS:
            # Greedy: the sampling knobs would change nothing (upstream resets them the same way).
            self.top_p, self.top_k, self.min_p = 1.0, 0, 0.0
        self.all_stop_token_ids = set(self.stop_token_ids)

    def _check_unsupported(self) -> None:
        for name in ("presence_penalty", "frequency_penalty"):
            if getattr(self, name) not in (None, 0, 0.0):
                raise ValueError(
                    f"{name} is not supported (use repetition_penalty), got {getattr(self, name)!r}"
                )
        if self.logit_bias is not None and not isinstance(self.logit_bias, dict):
            raise ValueError(
                f"logit_bias must be a dict of token id -> bias, got {self.logit_bias!r}"
            )
        # Even at biases of 0, keys that are no token ids make a malformed request, which
        # upstream refuses (the engine checks the ids against the vocabulary).
        for key in self.logit_bias or {}:
            logit_bias_token_id(key)
        if self.logit_bias and any(bias != 0 for bias in self.logit_bias.values()):
            raise ValueError("logit_bias is not supported (only biases of 0)")
        for name in ("allowed_token_ids", "bad_words"):
            if getattr(self, name):  # None or empty: nothing to restrict
                raise ValueError(f"{name} is not supported, got {getattr(self, name)!r}")
        if self.logits_processors is not None and not isinstance(self.logits_processors, list):
            raise ValueError(
                f"logits_processors must be a list, got {type(self.logits_processors).__name__}"
            )
        if self.logits_processors:
            raise ValueError(
                "logits_processors: per-request logits processors are not supported (nor are "
                "they by upstream's V1 engine)"
            )

    @staticmethod
    def _check_int(name: str, value: object, low: int, high: int | None = None) -> None:
        if not isinstance(value, int) or isinstance(value, bool):
            raise ValueError(f"{name} must be an integer, got {value!r}")
        SamplingParams._check_range(name, value, low, high)

    @staticmethod
    def _check_number(
        name: str, value: object, low: float = -math.inf, high: float | None = None
    ) -> None:
        if not isinstance(value, int | float) or isinstance(value, bool) or value != value:
            raise ValueError(f"{name} must be a number, got {value!r}")
        SamplingParams._check_range(name, value, low, high)

    @staticmethod
    def _check_range(name: str, value: float, low: float, high: float | None) -> None:
        if value < low or (high is not None and value > high):
            bounds = f"in [{low}, {high}]" if high is not None else f">= {low}"
            raise ValueError(f"{name} must be {bounds}, got {value}")

    @property
    def sampling_type(self) -> SamplingType:
        if self.temperature < _GREEDY_EPS:
            return SamplingType.GREEDY
        return SamplingType.RANDOM if self.seed is None else SamplingType.RANDOM_SEED

    def update_from_tokenizer(self, eos_token_id: int | None) -> None:
        """Add the tokenizer's eos to the stop tokens unless `ignore_eos` (called by the engine)."""
        self.all_stop_token_ids = set(self.stop_token_ids)
        if eos_token_id is not None and not self.ignore_eos:
            self.all_stop_token_ids.add(eos_token_id)

    def update_from_generation_config(
        self, eos_token_ids: "tuple[int, ...]", tokenizer_eos: int | None
    ) -> None:
        """Make the model's eos ids (vllm/config/generation.py) other than the tokenizer's stop
        token ids, unless `ignore_eos` (called by the engine, after `update_from_tokenizer`). As
        upstream, they then are the output's `stop_reason`, as a request's own stop tokens."""
        if self.ignore_eos:
            return
        extra = [t for t in eos_token_ids if t != tokenizer_eos and t not in self.stop_token_ids]
        if extra:
            self.stop_token_ids = [*self.stop_token_ids, *extra]  # a copy: not the caller's list
            self.all_stop_token_ids.update(extra)


def logit_bias_token_id(key: object) -> int:
    """The token id a `logit_bias` key names: an integer, or a string of one (the keys of
    OpenAI's JSON object), read as upstream reads it (`int`); a ValueError naming the field
    otherwise."""
    if isinstance(key, int) and not isinstance(key, bool):
        return key
    if isinstance(key, str):
        try:
            return int(key)
        except ValueError:
            pass
    raise ValueError(
        f"logit_bias keys must be token ids (integers, or strings of them), got {key!r}"
    )


def resolve_logprobs(count: int | None, vocab_size: int) -> int | None:
    """A `logprobs` / `prompt_logprobs` count as the sampler takes it: -1 (the whole vocabulary,
    upstream's meaning) as `vocab_size`, any other as it is."""
    return vocab_size if count == -1 else count


def check_truncate_prompt_tokens(value: object) -> None:
    """Raises ValueError naming the field unless `value` is -1 or an integer >= 1 (upstream's
    range: 0 would keep no prompt at all)."""
    if not isinstance(value, int) or isinstance(value, bool) or value == 0 or value < -1:
        raise ValueError(f"truncate_prompt_tokens must be -1 or an integer >= 1, got {value!r}")


def truncate_prompt(
    prompt_token_ids: list[int], truncate_prompt_tokens: int | None, max_model_len: int
) -> list[int]:
    """The prompt tokens a request runs on: the last `truncate_prompt_tokens` of them (-1: the
    last `max_model_len`, as upstream), or all where it is None. Callers apply it before they
    check the prompt's length (upstream's order), so that the prompt is checked as it will run.
    A value above `max_model_len` is a ValueError naming the field, as upstream refuses it (it
    could only keep prompts that cannot run)."""
    if truncate_prompt_tokens is None:
        return prompt_token_ids
    check_truncate_prompt_tokens(truncate_prompt_tokens)
    keep = max_model_len if truncate_prompt_tokens == -1 else truncate_prompt_tokens
    if keep > max_model_len:
        raise ValueError(
            f"truncate_prompt_tokens ({keep}) must be <= max_model_len ({max_model_len})"
        )
    return prompt_token_ids[-keep:]


def as_token_ids(values: object) -> list[int] | None:
    """`values` as a new list of Python int token ids, or None where it is not a list or tuple
    of integers: numpy integers (the elements of `list(array)`) count, bools do not. Python ints
    take the cheap check: for a 100k-token prompt 5 ms of host time, where testing each id
    against `numbers.Integral` took 34."""
    if not isinstance(values, list | tuple):
        return None
    if all(type(t) is int for t in values):
        return list(values)
    if all(isinstance(t, numbers.Integral) and not isinstance(t, bool) for t in values):
        return [int(t) for t in values]
    return None
