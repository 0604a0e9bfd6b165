"""A scripted stand-in for `LLMEngine` (same interface), for testing the server layers without a
model: every request replies with the token ids of a fixed script, one token per step, cut by
max_tokens, stop strings and stop token ids like the real engine, its text from the real engine's
`IncrementalDetokenizer` (so what streams is what the engine would stream: a possible start of a
stop string, or half a character, is held back); logprobs are made up but consistent (the sampled
token is always rank 1)."""

import dataclasses
import time
from types import SimpleNamespace

from vllm.config.generation import GenerationConfig
from vllm.model_executor.model_loader.builtin import resolve_model
from vllm.outputs import CompletionOutput, Logprob, RequestOutput
from vllm.sampling_params import SamplingParams
from vllm.transformers_utils.tokenizer import get_tokenizer
from vllm.v1.engine.detokenizer import IncrementalDetokenizer


@dataclasses.dataclass
class _Request:
    request_id: str
    prompt: str | None
    prompt_ids: list[int]
    params: SamplingParams
    detokenizer: IncrementalDetokenizer
    tokens: list[int] = dataclasses.field(default_factory=list)
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    text: str = ""


class _Counters:
    def __init__(self, blocks: int, slots: int, read_delay: float = 0.0) -> None:
        self.initial_num_free_blocks = self.num_free_blocks = blocks
        self.initial_num_free_kda_slots = self.num_free_kda_slots = slots
        self.read_delay = read_delay

    @property
    def usage(self) -> float:
        time.sleep(self.read_delay)
        return 1 - self.num_free_blocks / self.initial_num_free_blocks


class FakeEngine:
    def __init__(
        self,
        script: str,
        max_model_len: int = 128,
        step_delay: float = 0.0,
        abort_delay: float = 0.0,
        stats_delay: float = 0.0,
        generation_config: GenerationConfig | None = None,
    ) -> None:
        self.step_delay = step_delay
        self.abort_delay = abort_delay
        self.tokenizer = get_tokenizer(resolve_model("kimi-k3-tiny")[0])
        self.script = self.tokenizer.encode(script, add_special_tokens=False)
        self.config = SimpleNamespace(
            model_config=SimpleNamespace(
                max_model_len=max_model_len,
                vocab_size=320,
                logprobs_limit=20,
                generation_config=generation_config or GenerationConfig(),
            )
        )
        # `stats_delay` slows the loop's reading of the cache counters, which follows every abort.
        self.kv_cache_manager = _Counters(64, 16, stats_delay)
        self.scheduler = SimpleNamespace(num_running=0, num_waiting=0)
        self.requests: dict[str, _Request] = {}
        self.shut_down = False

    def add_request(self, request_id: str, prompt, params: SamplingParams) -> None:
        if request_id in self.requests:
            raise ValueError(f"request_id {request_id!r} is already in use")
        ids = self.tokenizer.encode(prompt) if isinstance(prompt, str) else list(prompt)
        if not ids:
            raise ValueError("the prompt is empty")
        if len(ids) >= self.config.model_config.max_model_len:
            raise ValueError("the prompt is too long")
        detokenizer = IncrementalDetokenizer(
            self.tokenizer, ids, params.stop, params.include_stop_str_in_output,
            params.skip_special_tokens, params.min_tokens,
        )  # fmt: skip
        self.requests[request_id] = _Request(request_id, prompt, ids, params, detokenizer)
        self.kv_cache_manager.num_free_blocks -= 1
        self.kv_cache_manager.num_free_kda_slots -= 1
        self.scheduler.num_running = len(self.requests)

    def has_unfinished_requests(self) -> bool:
        return bool(self.requests)

    def workers_alive(self) -> bool:
        return True  # no tensor-parallel workers

    def abort_request(self, request_ids: list[str]) -> list[RequestOutput]:
        time.sleep(self.abort_delay)
        outputs = []
        for request_id in request_ids:
            request = self.requests.get(request_id)
            if request is not None:
                request.finish_reason = "abort"
                outputs.append(self._finish(request))
        return outputs

    def step(self) -> list[RequestOutput]:
        time.sleep(self.step_delay)
        outputs = []
        for request in list(self.requests.values()):
            params = request.params
            token = self.script[len(request.tokens) % len(self.script)]
            request.tokens.append(token)
            stop = request.detokenizer.update([token])
            if stop is not None:
                request.finish_reason, request.stop_reason = "stop", stop
            if request.finish_reason is None and token in params.stop_token_ids:
                request.finish_reason, request.stop_reason = "stop", token
            if request.finish_reason is None and len(request.tokens) >= params.max_tokens:
                request.finish_reason = "length"
            finished = request.finish_reason is not None
            request.text = request.detokenizer.get_next_output_text(finished, delta=False)
            if request.finish_reason is not None:
                outputs.append(self._finish(request))
            else:
                outputs.append(self._output(request))
        return outputs

    def _finish(self, request: _Request) -> RequestOutput:
        del self.requests[request.request_id]
        self.kv_cache_manager.num_free_blocks += 1
        self.kv_cache_manager.num_free_kda_slots += 1
        self.scheduler.num_running = len(self.requests)
        return self._output(request)

    def _logprobs(self, token: int, k: int) -> dict[int, Logprob]:
        position = {token: Logprob(-0.5, 1, self.tokenizer.decode([token]))}
        for i in range(k):
            other = (token + 1 + i) % 256
            position.setdefault(other, Logprob(-2.0 - i, 2 + i, self.tokenizer.decode([other])))
        return position

    def _output(self, request: _Request) -> RequestOutput:
        params = request.params
        logprobs = None
        if params.logprobs is not None:
            logprobs = [self._logprobs(t, params.logprobs) for t in request.tokens]
        prompt_logprobs = None
        if params.prompt_logprobs is not None:
            prompt_logprobs = [None] + [
                self._logprobs(t, params.prompt_logprobs) for t in request.prompt_ids[1:]
            ]
        outputs = [
            CompletionOutput(
                i,
                request.text,
                list(request.tokens),
                None,
                logprobs,
                finish_reason=request.finish_reason,
                stop_reason=request.stop_reason,
            )
            for i in range(params.n)
        ]
        return RequestOutput(
            request.request_id,
            request.prompt,
            request.prompt_ids,
            prompt_logprobs,
            outputs,
            request.finish_reason is not None,
        )

    def shutdown(self) -> None:
        self.shut_down = True
