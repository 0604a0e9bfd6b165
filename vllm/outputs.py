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
    stop string or stop token id (None for eos and the other reasons).

    The fields are upstream's, in upstream's order (so that upstream code that builds one with
    positional arguments fills the same fields here), each holding what it holds upstream for a
    request this engine can run:

    - `routed_experts`: None. Upstream fills it (the experts each token was routed to, per
      layer) only when its engine is started to record them; this engine records no routing.
    - `lora_request`: None (no LoRA adapters here).
    - `kv_transfer_params`: None (upstream: what a KV connector passes on; there is none)."""

    index: int
    text: str
    token_ids: list[int]
    cumulative_logprob: float | None
    logprobs: list[PositionLogprobs] | None
    routed_experts: None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    lora_request: None = None
    kv_transfer_params: None = None

    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass
class RequestOutput:
    """The state of a request after a step: its prompt and each completion so far.

    `prompt_logprobs` has one entry per prompt token, the first None (nothing predicts it).

    The fields after `finished` are upstream's too (same names, same order, so that upstream code
    that builds or reads a `RequestOutput` runs here), each holding what it holds upstream for a
    request this engine can run:

    - `metrics`: always None. Upstream's V1 engine puts a per-request `RequestStateStats` there
      (arrival, queued, scheduled, first- and last-token timestamps) only while it logs stats;
      its `LLM` turns that off unless told otherwise, so an upstream `LLM` script gets None too.
      This engine records no per-request timestamps (the server's `AsyncLLM` times requests only
      for its Prometheus histograms), and values made up here would be read as measurements.
    - `lora_request`: None (no LoRA adapters here).
    - `encoder_prompt`, `encoder_prompt_token_ids`: None, upstream's value for a decoder-only
      model.
    - `num_cached_tokens`: prompt tokens whose KV came from the prefix cache: 0, as there is no
      prefix cache (every prompt is prefilled in full; docs/engine.md, "Not supported yet").

    `kv_transfer_params` (upstream: what a KV connector passes on) is None: there is no KV
    connector."""

    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    prompt_logprobs: list[PositionLogprobs | None] | None
    outputs: list[CompletionOutput]
    finished: bool
    metrics: None = None
    lora_request: None = None
    encoder_prompt: str | None = None
    encoder_prompt_token_ids: list[int] | None = None
    num_cached_tokens: int = 0

    @property
    def kv_transfer_params(self) -> None:
        return None
