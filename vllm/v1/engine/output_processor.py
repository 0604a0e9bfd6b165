"""From sampled token ids to `RequestOutput`s: detokenization, stop strings, logprobs, and the
gathering of a request's `n` completions (each scheduled as its own sequence) into one output."""

from dataclasses import dataclass, field

from vllm.logger import init_logger
from vllm.outputs import CompletionOutput, Logprob, PositionLogprobs, RequestOutput
from vllm.sampling_params import RequestOutputKind, SamplingParams
from vllm.transformers_utils.tokenizer import Tokenizer
from vllm.v1.engine.detokenizer import IncrementalDetokenizer
from vllm.v1.request import Request

logger = init_logger(__name__)


@dataclass
class _Completion:
    index: int
    request: Request
    # None without a tokenizer, or with `detokenize=False`: no text.
    detokenizer: IncrementalDetokenizer | None
    logprobs: list[PositionLogprobs] | None
    cumulative_logprob: float | None
    discard_output: bool  # max_tokens=0: the one token sampled to end the prefill is dropped
    finish_reason: str | None = None
    stop_reason: int | str | None = None


@dataclass
class _RequestState:
    request_id: str
    prompt: str | None
    # A tuple, which the garbage collector stops walking (see vllm/v1/request.py); the list that
    # outputs carry is made at the first output and shared by the later ones.
    prompt_token_ids: tuple[int, ...]
    params: SamplingParams
    completions: list[_Completion]
    # What decodes the logprobs' tokens: None without a tokenizer or with `detokenize=False`.
    tokenizer: Tokenizer | None = None
    prompt_logprobs: list[PositionLogprobs | None] | None = field(default=None)
    prompt_list: list[int] | None = None


class OutputProcessor:
    def __init__(self, tokenizer) -> None:
        self.tokenizer = tokenizer
        self.requests: dict[str, _RequestState] = {}
        self.parent_of: dict[str, tuple[str, int]] = {}  # sequence id -> (request id, index)
        # Sequences whose sampled tokens need no work until they finish: final-only output, no
        # text, no logprobs. `process` skips them (per sequence per step, that costs).
        self._idle: set[str] = set()

    def add_request(
        self,
        request_id: str,
        prompt: str | None,
        prompt_token_ids: list[int],
        params: SamplingParams,
        sequences: list[Request],
        discard_output: bool,
    ) -> None:
        # As upstream, `detokenize=False` takes the tokenizer away from the request's text and
        # logprobs alike: none of its tokens is decoded.
        tokenizer = self.tokenizer if params.detokenize else None
        completions = []
        for i, seq in enumerate(sequences):
            detok = None
            if tokenizer is not None:
                detok = IncrementalDetokenizer(
                    tokenizer, prompt_token_ids, params.stop,
                    params.include_stop_str_in_output, params.skip_special_tokens,
                    params.min_tokens,
                )  # fmt: skip
            wants = params.logprobs is not None
            completions.append(
                _Completion(
                    i, seq, detok, [] if wants else None, 0.0 if wants else None, discard_output
                )  # fmt: skip
            )
            self.parent_of[seq.request_id] = (request_id, i)
            if (
                params.output_kind is RequestOutputKind.FINAL_ONLY
                and detok is None
                and not wants
                and not discard_output
            ):
                self._idle.add(seq.request_id)
        state = _RequestState(
            request_id, prompt, tuple(prompt_token_ids), params, completions, tokenizer
        )
        if params.prompt_logprobs is not None:
            state.prompt_logprobs = [None]
        self.requests[request_id] = state

    def sequences_of(self, request_id: str) -> list[str]:
        state = self.requests.get(request_id)
        return [c.request.request_id for c in state.completions] if state else []

    def process(
        self,
        sampled: dict[str, list[int]],
        logprobs: dict[str, tuple[list[int], list[float], int]],
        prompt_logprobs: dict[str, list[tuple[list[int], list[float], int]]],
        finished: list[Request],
    ) -> tuple[list[RequestOutput], list[tuple[str, str]]]:
        """Fold one step in. Returns the outputs of requests that changed (a `FINAL_ONLY` request's
        only once it finished), and the sequences that finished here rather than in the
        scheduler, as (sequence id, "stop" for a stop string or "error" when their output could
        not be processed), for the scheduler to free."""
        touched: dict[str, _RequestState] = {}
        stopped = []
        # Sequences whose last token is eos or one of their stop_token_ids.
        stop_token_ended = {seq.request_id for seq in finished if seq.finish_reason == "stop"}
        for seq_id, rows in prompt_logprobs.items():
            state = self.requests[self.parent_of[seq_id][0]]
            state.prompt_logprobs += [self._position(state.tokenizer, *row) for row in rows]
        idle = self._idle
        for seq_id, tokens in sampled.items():
            if seq_id in idle:
                continue
            request_id, index = self.parent_of[seq_id]
            state = self.requests[request_id]
            completion = state.completions[index]
            if state.params.output_kind is RequestOutputKind.CUMULATIVE:
                touched[request_id] = state
            if completion.discard_output:
                continue
            if seq_id in logprobs:
                position = self._position(state.tokenizer, *logprobs[seq_id])
                completion.logprobs.append(position)
                completion.cumulative_logprob += position[tokens[-1]].logprob
            if completion.detokenizer is None:
                continue
            text_tokens = tokens
            if seq_id in stop_token_ended and not state.params.include_stop_str_in_output:
                # The stop token ends the token ids but, like a stop string, stays out of the
                # text unless asked for (as upstream).
                text_tokens = tokens[:-1]
            try:
                stop = completion.detokenizer.update(text_tokens) if text_tokens else None
            except Exception:
                # One request's bad output must not take the engine down with it.
                logger.exception("request %s failed while detokenizing", seq_id)
                completion.finish_reason = "error"
                stopped.append((seq_id, "error"))
                touched[request_id] = state
                continue
            if stop is not None and completion.finish_reason is None:
                completion.finish_reason, completion.stop_reason = "stop", stop
                stopped.append((seq_id, "stop"))
                touched[request_id] = state
        for seq in finished:
            request_id, index = self.parent_of[seq.request_id]
            completion = self.requests[request_id].completions[index]
            if completion.finish_reason is None:
                if completion.discard_output:
                    # max_tokens=0: the dropped token generated nothing, so stopped nothing,
                    # whether or not it is a stop token.
                    completion.finish_reason = "length"
                else:
                    completion.finish_reason = seq.finish_reason
                    completion.stop_reason = seq.stop_reason
            touched[request_id] = self.requests[request_id]
        outputs = []
        for state in touched.values():
            out = self._output(state)
            if out.finished:
                self._forget(out.request_id)
            if out.finished or state.params.output_kind is RequestOutputKind.CUMULATIVE:
                outputs.append(out)
        return outputs, stopped

    def finish_with(self, seq_id: str, reason: str) -> RequestOutput | None:
        """Mark one sequence finished for `reason` (abort, error); the request's output if that
        finished it."""
        if seq_id not in self.parent_of:
            return None
        request_id, index = self.parent_of[seq_id]
        state = self.requests[request_id]
        completion = state.completions[index]
        if completion.finish_reason is None:
            completion.finish_reason = reason
        out = self._output(state)
        if out.finished:
            self._forget(request_id)
        return out

    def _forget(self, request_id: str) -> None:
        state = self.requests.pop(request_id)
        for completion in state.completions:
            self.parent_of.pop(completion.request.request_id, None)
            self._idle.discard(completion.request.request_id)

    @staticmethod
    def _position(
        tokenizer: Tokenizer | None, token_ids: list[int], logprobs: list[float], rank: int
    ) -> PositionLogprobs:
        """Column 0 is the chosen token (with its vocabulary rank), then the top-k, best first;
        each with its text where `tokenizer` is given.

        Every rank follows the sampler's policy: 1 + the number of strictly more likely tokens,
        so tied tokens share the best rank. Every token more likely than top-k column i is in
        columns 1..i-1, so that count is read off the sorted columns."""
        position = {}
        top_rank = 0
        for i, (token, value) in enumerate(zip(token_ids, logprobs, strict=True)):
            if i == 1 or (i > 1 and value < logprobs[i - 1]):
                top_rank = i
            if token not in position:
                text = None
                if tokenizer is not None:
                    text = tokenizer.decode([token], skip_special_tokens=False)
                position[token] = Logprob(value, rank if i == 0 else top_rank, text)
        return position

    def _output(self, state: _RequestState) -> RequestOutput:
        outputs, finished = [], True
        for c in state.completions:
            done = c.finish_reason is not None
            finished = finished and done
            # Until done, what could still turn into a stop string (or half a character) is
            # held back.
            text = ""
            if not c.discard_output and c.detokenizer is not None:
                text = c.detokenizer.get_next_output_text(done, False)
            tokens = [] if c.discard_output else list(c.request.output_token_ids)
            # Positional, `routed_experts` None: keyword arguments made each output's
            # construction about 0.2 us slower (once per request per step when streamed).
            outputs.append(
                CompletionOutput(
                    c.index, text, tokens, c.cumulative_logprob,
                    None if c.logprobs is None else list(c.logprobs),
                    None, c.finish_reason, c.stop_reason,
                )
            )  # fmt: skip
        if state.prompt_list is None:
            state.prompt_list = list(state.prompt_token_ids)
        return RequestOutput(
            state.request_id, state.prompt, state.prompt_list,
            None if state.prompt_logprobs is None else list(state.prompt_logprobs),
            outputs, finished,
        )  # fmt: skip
