"""`LLMEngine`: the step loop. Requests are checked and tokenized when added; each `step()`
schedules a batch, runs it, samples, folds the tokens into the requests and returns the outputs of
the requests that changed.

With `async_scheduling` (the default on a GPU), a decode step that can go on launches its
continuation before its own tokens are read back (`AsyncScheduler`, vllm/v1/core/sched/), so the
host's work of one step overlaps the device's work of the step before; each `step()` call still
returns one step's outputs.

A request with `n > 1` is scheduled as n sequences `<request_id>#<i>` (their own KDA slots and
blocks; no prefix sharing), gathered back into one `RequestOutput`.

Besides the tokenizer's eos and a request's `stop_token_ids`, the model's own eos ids (its
generation config, `--generation-config`: vllm/config/generation.py) stop a sequence unless the
request sets `ignore_eos`.

With `skip_tokenizer_init` there is no tokenizer (as upstream): prompts must be token ids, outputs
carry token ids and empty text, no tokenizer eos stops a sequence (only `stop_token_ids`, the
model's generation-config eos ids, `max_tokens` and `max_model_len` do) and stop strings are
refused.
"""

import dataclasses
import itertools
import time
from dataclasses import dataclass

from vllm.config.vllm import VllmConfig
from vllm.engine.arg_utils import EngineArgs
from vllm.logger import init_logger
from vllm.outputs import RequestOutput
from vllm.sampling_params import (
    SamplingParams,
    as_token_ids,
    logit_bias_token_id,
    resolve_logprobs,
    truncate_prompt,
)
from vllm.transformers_utils.tokenizer import get_tokenizer
from vllm.utils.gc_utils import freeze_startup_heap, unfreeze_heap
from vllm.v1.core.kv_cache_manager import KVCacheManager
from vllm.v1.core.kv_cache_utils import determine_cache_sizes
from vllm.v1.core.sched.async_scheduler import AsyncScheduler
from vllm.v1.core.sched.output import SchedulerOutput
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.engine.output_processor import OutputProcessor
from vllm.v1.executor.multiproc_executor import Executor
from vllm.v1.outputs import SampledStep
from vllm.v1.request import Request, RequestStatus

logger = init_logger(__name__)
_RUNNING = RequestStatus.RUNNING


@dataclass(slots=True)
class _Launched:
    """A step whose forward and sampling are enqueued on the device."""

    scheduled: SchedulerOutput
    sampled: SampledStep


class LLMEngine:
    def __init__(self, config: VllmConfig) -> None:
        self.config = config
        mc, cc, sc = config.model_config, config.cache_config, config.scheduler_config
        self.tokenizer = None if mc.tokenizer is None else get_tokenizer(mc.tokenizer)
        self.executor = Executor(config)
        start = time.perf_counter()
        try:
            self.executor.collective_rpc("load_model")
            budget = None
            if cc.num_gpu_blocks_override is None:
                budget = self.executor.collective_rpc("available_cache_memory")
            runner = self.executor.runner
            sizes = determine_cache_sizes(
                runner.spec, cc.block_size, sc.max_num_seqs, sc.max_model_len, budget,
                cc.num_gpu_blocks_override,
            )  # fmt: skip
            cc.num_blocks, cc.num_kda_slots = sizes.num_blocks, sizes.num_kda_slots
            # Where the budget was given, not profiled: the profiling run's prefill steps.
            self.executor.collective_rpc("warm_up_prefill_steps")
            self.executor.collective_rpc("initialize_cache", sizes.num_blocks, sizes.num_kda_slots)
            self.executor.collective_rpc("capture_cudagraphs")
            self.kv_cache_manager = KVCacheManager(
                sizes.num_blocks, cc.block_size, sizes.num_kda_slots
            )
            self.async_scheduling = sc.async_scheduling
            scheduler_class = AsyncScheduler if self.async_scheduling else Scheduler
            self.scheduler = scheduler_class(
                sc.max_num_seqs, sc.max_num_batched_tokens, sc.max_model_len, self.kv_cache_manager
            )
        except BaseException:
            # Whatever failed, the workers and the process group go (a TP engine left up would
            # refuse every later engine in this process).
            self.executor.shutdown()
            raise
        logger.info("Engine ready in %.1f s (%s, %s, TP=%d, asynchronous scheduling %s)",
                    time.perf_counter() - start, mc.model, mc.dtype,
                    config.parallel_config.tensor_parallel_size,
                    "on" if sc.async_scheduling else "off")  # fmt: skip
        generation = mc.generation_config
        if generation.sampling_defaults:
            logger.info("Default sampling parameters %s come from the model's generation config "
                        "%s (requests that set them win; --generation-config vllm drops them)",
                        generation.sampling_defaults, generation.source)  # fmt: skip
        tokenizer_eos = None if self.tokenizer is None else self.tokenizer.eos_token_id
        extra_eos = [i for i in generation.eos_token_ids if i != tokenizer_eos]
        if extra_eos:
            # A model that ends its turns on another token than the tokenizer's eos: said once,
            # since it decides where every reply stops.
            logger.info("Stop token ids %s come from the model's generation config %s "
                        "(ignore_eos turns them off)", extra_eos, generation.source)  # fmt: skip
        self._in_flight: _Launched | None = None
        self.output_processor = OutputProcessor(self.tokenizer)
        self._arrivals = itertools.count()
        self._shut_down = False
        freeze_startup_heap()

    @classmethod
    def from_engine_args(cls, engine_args: EngineArgs) -> "LLMEngine":
        return cls(engine_args.create_engine_config())

    # -- requests -----------------------------------------------------------------------------

    def add_request(
        self,
        request_id: str,
        prompt: "str | list[int]",
        params: SamplingParams | None = None,
        prompt_text: str | None = None,
    ) -> None:
        """Check and queue a request. Raises ValueError (naming what is wrong) for an empty or
        too long prompt, token ids outside the vocabulary, a `min_tokens` that cannot fit in
        `max_model_len` (a `max_tokens` past it is capped there), a `truncate_prompt_tokens`
        above `max_model_len`, or a request id already in use. The prompt is truncated
        (`truncate_prompt_tokens`) before its length is checked, and the outputs report the
        tokens that run. `prompt_text`: the text the outputs report as their `prompt` where
        `prompt` is token ids (`LLM.chat`'s rendering)."""
        self._check_running()
        params = params or SamplingParams()
        if not isinstance(request_id, str) or not request_id:
            raise ValueError(f"request_id must be a non-empty string, got {request_id!r}")
        if request_id in self.output_processor.requests:
            raise ValueError(f"request_id {request_id!r} is already in use")
        if self.tokenizer is None and params.stop:
            raise ValueError("stop strings need a tokenizer (skip_tokenizer_init is set)")
        text, ids = self._tokenize(prompt)
        if text is None:
            text = prompt_text
        num_logprobs, num_prompt_logprobs = self._check_vocab_bounds(params)
        max_len = self.config.scheduler_config.max_model_len
        kept = truncate_prompt(ids, params.truncate_prompt_tokens, max_len)
        if len(kept) < len(ids):
            ids, text = kept, self._prompt_text(kept, params)
        if len(ids) >= max_len:
            raise ValueError(
                f"the prompt has {len(ids)} tokens; max_model_len {max_len} leaves no room for "
                "an output token"
            )
        room = max_len - len(ids)
        if params.min_tokens > room:
            raise ValueError(
                f"min_tokens {params.min_tokens} does not fit: the prompt has {len(ids)} tokens "
                f"and max_model_len is {max_len} (at most {room})"
            )
        # As upstream, a reply stops at max_model_len (finish_reason "length"): a max_tokens past
        # the room the prompt leaves is capped there, so one long prompt fails no batch.
        max_tokens = room if params.max_tokens is None else min(params.max_tokens, room)
        discard = max_tokens == 0  # prompt scoring only: run the prefill, drop its token
        eos = None if self.tokenizer is None else self.tokenizer.eos_token_id
        model_eos = self.config.model_config.generation_config.eos_token_ids
        sequences = []
        for i in range(params.n):
            seed = None if params.seed is None else params.seed + i
            # The sequences carry the counts the sampler takes (-1 made the vocabulary size).
            child = dataclasses.replace(
                params, n=1, seed=seed, max_tokens=max(max_tokens, 1), logprobs=num_logprobs,
                prompt_logprobs=num_prompt_logprobs if i == 0 else None,
            )  # fmt: skip
            child.update_from_tokenizer(eos)
            child.update_from_generation_config(model_eos, eos)
            sequences.append(
                Request(
                    f"{request_id}#{i}",
                    list(ids),
                    child,
                    eos,
                    max(max_tokens, 1),
                    next(self._arrivals),
                )  # fmt: skip
            )
        self.output_processor.add_request(request_id, text, ids, params, sequences, discard)
        for seq in sequences:
            self.scheduler.add_request(seq)

    def _prompt_text(self, ids: list[int], params: SamplingParams) -> str | None:
        """The text the outputs report for a truncated prompt: that of the tokens that run (the
        given text would claim tokens that did not), special tokens included as in a chat
        rendering; None where nothing may be decoded (no tokenizer, `detokenize=False`)."""
        if self.tokenizer is None or not params.detokenize:
            return None
        return self.tokenizer.decode(ids, skip_special_tokens=False)

    def _check_vocab_bounds(self, params: SamplingParams) -> tuple[int | None, int | None]:
        """What SamplingParams cannot check alone: token ids and top-k counts against the
        vocabulary, so that no request fails during a step. Returns the `logprobs` and
        `prompt_logprobs` counts the sampler takes: -1, the whole vocabulary, is its size, held
        to the same limit as upstream holds it (allowed only where `max_logprobs` is -1 or at
        least the vocabulary size)."""
        vocab = self.config.model_config.vocab_size
        bad = [t for t in params.stop_token_ids or [] if not 0 <= t < vocab]
        if bad:
            raise ValueError(f"stop_token_ids outside the vocabulary [0, {vocab}): {bad[:5]}")
        biased = map(logit_bias_token_id, params.logit_bias or {})
        bad = [t for t in biased if not 0 <= t < vocab]
        if bad:
            raise ValueError(f"logit_bias token ids outside the vocabulary [0, {vocab}): {bad[:5]}")
        limit = self.config.model_config.logprobs_limit
        counts = []
        for name in ("logprobs", "prompt_logprobs"):
            asked = getattr(params, name)
            value = resolve_logprobs(asked, vocab)
            if value is not None and value > limit:
                if asked == -1:
                    raise ValueError(
                        f"{name} -1 asks for the whole vocabulary ({vocab} tokens), but this "
                        f"engine allows at most {limit} (max_logprobs); start it with "
                        "max_logprobs=-1 (--max-logprobs -1) to allow the whole vocabulary"
                    )
                raise ValueError(
                    f"{name} {value} exceeds {limit}, the most a request may ask for (the "
                    f"vocabulary size {vocab}, or max_logprobs if smaller; -1 lifts that)"
                )
            counts.append(value)
        return counts[0], counts[1]

    def _tokenize(self, prompt: "str | list[int]") -> tuple[str | None, list[int]]:
        if isinstance(prompt, str):
            if self.tokenizer is None:
                raise ValueError("a text prompt needs a tokenizer: pass token ids")
            ids = self.tokenizer.encode(prompt)
            text = prompt
        elif (ids := as_token_ids(prompt)) is not None:
            text = None
        else:
            raise ValueError("prompt must be a string or a list of token ids")
        if not ids:
            raise ValueError("the prompt is empty")
        vocab = self.config.model_config.vocab_size
        bad = [t for t in ids if not 0 <= t < vocab]
        if bad:
            raise ValueError(f"prompt token ids outside the vocabulary [0, {vocab}): {bad[:5]}")
        return text, ids

    def abort_request(self, request_ids: "str | list[str]") -> list[RequestOutput]:
        """Abort requests in any state, freeing their blocks and slots; unknown ids are ignored.
        Returns their final outputs (finish_reason "abort")."""
        if isinstance(request_ids, str):
            request_ids = [request_ids]
        outputs = []
        for request_id in request_ids:
            seqs = self.output_processor.sequences_of(request_id)
            self.scheduler.finish_requests(seqs, RequestStatus.FINISHED_ABORTED)
            self.executor.runner.free_requests(seqs)
            for seq in seqs:
                out = self.output_processor.finish_with(seq, "abort")
                if out is not None and out.finished:
                    outputs.append(out)
        self._drop_stale_in_flight()
        return outputs

    @property
    def step_in_flight(self) -> bool:
        """Whether a step was launched ahead and the next `step()` call returns its outputs."""
        return self._in_flight is not None

    def has_unfinished_requests(self) -> bool:
        return self.scheduler.has_unfinished_requests()

    def workers_alive(self) -> bool:
        """Whether every tensor-parallel worker still runs (safe from any thread)."""
        return self.executor.workers_alive()

    def get_num_unfinished_requests(self) -> int:
        return len(self.output_processor.requests)

    # -- the step -----------------------------------------------------------------------------

    def step(self) -> list[RequestOutput]:
        """Run one step and return the outputs of the requests it changed. With asynchronous
        scheduling, a decode step that can go on launches its continuation before its own tokens
        are read back (`AsyncScheduler`); the next call completes that one."""
        self._check_running()
        launched, self._in_flight = self._in_flight, None
        if launched is None:
            scheduled = self.scheduler.schedule()
            if not scheduled.entries:
                return []
            launched = self._launch(scheduled)
        if self.async_scheduling:
            self._in_flight = self._launch_ahead(launched)
        outputs = self._complete(launched)
        self._drop_stale_in_flight()
        return outputs

    def _drop_stale_in_flight(self) -> None:
        """Forget the step launched ahead once every sequence in it has ended (a stop token in
        the step before, an abort): nothing would be taken from it. The device still runs it,
        ordered before any later step on the stream, so the blocks and KDA slots its sequences
        freed are only reused after it; its host buffers are the caching allocator's to keep
        until their copies are done."""
        launched = self._in_flight
        if launched is not None and not any(
            e.request.status is _RUNNING for e in launched.scheduled.entries
        ):
            self._in_flight = None
            self.scheduler.cancel_step(launched.scheduled)

    def _launch(
        self, scheduled: SchedulerOutput, failing: SchedulerOutput | None = None
    ) -> _Launched:
        """Run the step's forward and enqueue its sampling; nothing waits for the device. On an
        error the step `failing` (default: this one) and those after it fail."""
        runner = self.executor.runner
        try:
            step, plan = runner.prepare(scheduled)
            logits = self.executor.collective_rpc("execute", step)
            return _Launched(scheduled, runner.sample(logits, plan))
        except BaseException:
            # The step's sequences may hold half-written cache state: finish them as errors so
            # the scheduler can go on with the rest (then let the caller see the exception).
            self._fail_step(failing or scheduled)
            raise

    def _launch_ahead(self, launched: _Launched) -> "_Launched | None":
        """Launch the step that follows `launched` when the scheduler and the sampler can take
        it before `launched`'s tokens are known; None otherwise."""
        entries = launched.scheduled.entries
        # On an error, the step launched before fails too: it holds the same sequences.
        try:
            ahead = None
            if self.executor.runner.can_sample_ahead([e.request for e in entries]):
                ahead = self.scheduler.schedule_ahead(launched.scheduled)
        except BaseException:
            self._fail_step(launched.scheduled)
            raise
        if ahead is None:
            return None
        return self._launch(ahead, failing=launched.scheduled)

    def _complete(self, launched: _Launched) -> list[RequestOutput]:
        """Wait for the step's tokens and fold them into the requests."""
        scheduled = launched.scheduled
        try:
            result = launched.sampled.result()
            sampled, logprobs = result.sampled, result.logprobs
            if scheduled.follows:
                # Sequences that ended after this step was launched (a stop token or string in
                # the step before, an abort) get nothing from it.
                live = [e.request_id for e in scheduled.entries if e.request.status is _RUNNING]
                if len(live) < len(sampled):
                    sampled = {rid: sampled[rid] for rid in live}
                    logprobs = {rid: logprobs[rid] for rid in live if rid in logprobs}
            finished = self.scheduler.update_from_output(scheduled, sampled)
        except BaseException:
            # Until the scheduler records the step (an error, or Ctrl-C, before that), it stays
            # scheduled and every later schedule() would refuse: fail it, with any step launched
            # after it (void with it). Once recorded, the caller's aborts clean up (`LLM`).
            if self.scheduler.is_scheduled(scheduled):
                self._in_flight = None
                self._fail_step(scheduled)
            raise
        outputs, stopped = self.output_processor.process(
            sampled, logprobs, result.prompt_logprobs, finished
        )
        for seq_id, reason in stopped:
            status = (
                RequestStatus.FINISHED_STOPPED
                if reason == "stop"
                else (RequestStatus.FINISHED_ERROR)
            )
            self.scheduler.finish_requests([seq_id], status)
        done = [seq.request_id for seq in finished] + [seq_id for seq_id, _ in stopped]
        self.executor.runner.free_requests(done)
        return outputs

    def _fail_step(self, sched_out: SchedulerOutput) -> None:
        """Forget the step (and any scheduled after it, which holds the same sequences) and
        finish its sequences as errors."""
        # Only sequences still the step's own: one that ended since may have had its id reused.
        owned = self.scheduler.requests
        seq_ids = [e.request_id for e in sched_out.entries if owned.get(e.request_id) is e.request]
        self.scheduler.cancel_step(sched_out)
        self.scheduler.finish_requests(seq_ids, RequestStatus.FINISHED_ERROR)
        self.executor.runner.free_requests(seq_ids)
        for seq_id in seq_ids:
            self.output_processor.finish_with(seq_id, "error")

    def _check_running(self) -> None:
        # Past shutdown a TP engine's workers and process group are gone (rank 0 alone would
        # run its shard of the model); refuse at TP 1 as well, for one behaviour.
        if self._shut_down:
            raise RuntimeError("the engine was shut down (shutdown()); build a new one")

    def shutdown(self) -> None:
        """Stop the workers; later `add_request` / `step` calls raise `RuntimeError`. Calling it
        again does nothing more: not even `unfreeze_heap`, which would undo the frozen start-up
        heap of an engine built since (an old `LLM` collected after its name was rebound)."""
        if self._shut_down:
            return
        self._shut_down = True
        self.executor.shutdown()
        unfreeze_heap()
