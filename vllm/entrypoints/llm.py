"""`LLM`: offline batched generation, upstream's API.

    from vllm import LLM, SamplingParams
    llm = LLM("kimi-k3-tiny")
    outputs = llm.generate(["Hello"], SamplingParams(temperature=0, max_tokens=8))

Keyword arguments are `EngineArgs` fields (`tensor_parallel_size`, `quantization_config`,
`load_format`, `max_model_len`, `enforce_eager`, `seed`, `dtype`, ...); an unknown or bad one fails
at construction with a message naming it.
"""

import dataclasses
import itertools
import sys
from collections.abc import Sequence
from typing import Any

from tqdm import tqdm

from vllm.engine.arg_utils import EngineArgs
from vllm.outputs import RequestOutput
from vllm.sampling_params import RequestOutputKind, SamplingParams
from vllm.v1.engine.llm_engine import LLMEngine

Prompt = str | list[int]


class LLM:
    def __init__(self, model: str, **kwargs: Any) -> None:
        known = {f.name for f in dataclasses.fields(EngineArgs)}
        unknown = sorted(set(kwargs) - known)
        if unknown:
            raise ValueError(f"LLM got unknown arguments {unknown}; see EngineArgs for the list")
        self.llm_engine = LLMEngine.from_engine_args(EngineArgs(model=model, **kwargs))
        self._ids = itertools.count()

    def get_tokenizer(self):
        return self.llm_engine.tokenizer

    def generate(
        self,
        prompts: "Prompt | Sequence[Prompt]",
        sampling_params: "SamplingParams | Sequence[SamplingParams] | None" = None,
        use_tqdm: bool = True,
    ) -> list[RequestOutput]:
        """Generate for every prompt (text or token ids); outputs in prompt order. One
        `SamplingParams` for all, or one per prompt."""
        if isinstance(prompts, str) or (
            isinstance(prompts, list) and prompts and isinstance(prompts[0], int)
        ):
            prompts = [prompts]
        prompts = list(prompts)
        if sampling_params is None or isinstance(sampling_params, SamplingParams):
            params = [sampling_params or SamplingParams()] * len(prompts)
        else:
            params = list(sampling_params)
            if len(params) != len(prompts):
                raise ValueError(
                    f"sampling_params has {len(params)} entries for {len(prompts)} prompts"
                )
        return self._run(prompts, params, use_tqdm)

    def chat(
        self,
        messages: "list[dict[str, str]] | list[list[dict[str, str]]]",
        sampling_params: "SamplingParams | Sequence[SamplingParams] | None" = None,
        use_tqdm: bool = True,
        add_generation_prompt: bool = True,
        chat_template_kwargs: dict[str, Any] | None = None,
    ) -> list[RequestOutput]:
        """Generate replies to one conversation (a list of `{"role", "content"}` messages) or a
        list of them, rendered with the tokenizer's chat template."""
        tokenizer = self.get_tokenizer()
        if tokenizer is None:
            raise ValueError("chat needs a tokenizer (skip_tokenizer_init is set)")
        conversations = [messages] if messages and isinstance(messages[0], dict) else messages
        kwargs = tokenizer.chat_template_arguments(add_generation_prompt, chat_template_kwargs)
        prompts = [
            tokenizer.apply_chat_template(conv, tokenize=True, **kwargs) for conv in conversations
        ]
        return self.generate(prompts, sampling_params, use_tqdm)

    def _run(
        self, prompts: list[Prompt], params: list[SamplingParams], use_tqdm: bool
    ) -> list[RequestOutput]:
        engine = self.llm_engine
        order = {}
        try:
            for prompt, p in zip(prompts, params, strict=True):
                request_id = str(next(self._ids))
                # Only final outputs are read here: the engine need not build the others.
                final_only = dataclasses.replace(p, output_kind=RequestOutputKind.FINAL_ONLY)
                engine.add_request(request_id, prompt, final_only)
                order[request_id] = len(order)
        except BaseException:  # a bad prompt, or Ctrl-C while a long batch is added
            engine.abort_request(list(order))
            raise
        results: dict[str, RequestOutput] = {}
        bar = tqdm(total=len(order), desc="Processed prompts", disable=not use_tqdm)
        try:
            while len(results) < len(order):
                if not engine.has_unfinished_requests():
                    raise RuntimeError("the engine stopped with requests unfinished")
                for out in engine.step():
                    if out.finished and out.request_id in order:
                        results[out.request_id] = out
                        bar.update(1)
        except BaseException:
            engine.abort_request([r for r in order if r not in results])
            raise
        finally:
            bar.close()
        return sorted(results.values(), key=lambda out: order[out.request_id])

    def shutdown(self) -> None:
        """Stop tensor-parallel workers (also done at interpreter exit, as they are daemons)."""
        self.llm_engine.shutdown()

    def __del__(self, _is_finalizing=sys.is_finalizing) -> None:
        engine = getattr(self, "llm_engine", None)
        # At interpreter exit module globals (`sys` too: hence the default argument) may already
        # be gone; the daemon workers die anyway.
        if engine is not None and not _is_finalizing():
            engine.shutdown()
