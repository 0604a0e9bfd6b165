"""`LLM`: offline batched generation, upstream's API.

    from vllm import LLM, SamplingParams
    llm = LLM("kimi-k3-tiny")
    outputs = llm.generate(["Hello"], SamplingParams(temperature=0, max_tokens=8))

Keyword arguments are `EngineArgs` fields (`tensor_parallel_size`, `quantization_config`,
`load_format`, `max_model_len`, `enforce_eager`, `seed`, `dtype`, `generation_config`, ...); an
unknown or bad one fails at construction with a message naming it. Upstream's keywords whose effect
here is nil or already the behaviour (`disable_log_stats`, `enable_prefix_caching`, `revision`,
...) are fields too, taken where their value names what this engine does (docs/engine.md,
"Upstream's arguments that change nothing here"). Without sampling params,
`generate` and `chat` use `get_default_sampling_params()`: the model's generation config may set
some (vllm/config/generation.py).
"""

import dataclasses
import itertools
import numbers
import sys
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from tqdm import tqdm

from vllm.engine.arg_utils import UPSTREAM_NAMES, EngineArgs
from vllm.inputs import PromptType
from vllm.outputs import RequestOutput
from vllm.sampling_params import RequestOutputKind, SamplingParams
from vllm.v1.engine.llm_engine import LLMEngine

# Text, token ids, or upstream's dict forms (vllm/inputs): {"prompt": text} (TextPrompt) and
# {"prompt_token_ids": ids} (TokensPrompt); other keys of a dict are checked by `_unpack`.
Prompt = PromptType | list[int] | dict[str, Any]


# Keys of upstream's dict prompts that change nothing here: `cache_salt` isolates a request's
# prefix-cache entries, and this engine shares none between requests.
_NEUTRAL_PROMPT_KEYS = frozenset({"cache_salt"})


def _unpack(prompt: Prompt) -> tuple[str | list[int], str | None]:
    """The text or token ids of one prompt (a dict form unpacked; the rest the engine checks),
    and the text its outputs report where the dict gives token ids with their `prompt` text (as
    upstream's TokensPrompt may). A dict's other keys are taken when null (upstream's optional
    fields, which some callers always set) or neutral (`_NEUTRAL_PROMPT_KEYS`), else refused by
    name."""
    if not isinstance(prompt, dict):
        return prompt, None
    prompt = {k: v for k, v in prompt.items() if v is not None and k not in _NEUTRAL_PROMPT_KEYS}
    text = prompt.get("prompt")
    if "prompt" in prompt and not isinstance(text, str):
        raise ValueError(f"'prompt' must be a string, got {text!r}")
    if set(prompt) == {"prompt"}:
        return text, None
    if set(prompt) in ({"prompt_token_ids"}, {"prompt_token_ids", "prompt"}):
        ids = prompt["prompt_token_ids"]
        if not isinstance(ids, list | tuple):
            raise ValueError(f"'prompt_token_ids' must be a list of token ids, got {ids!r}")
        return ids, text
    raise ValueError(
        "a dict prompt holds 'prompt' (text) or 'prompt_token_ids' (token ids, optionally with "
        f"their 'prompt' text), got keys {sorted(prompt, key=str)}"
    )


def _per_prompt(
    sampling_params: "SamplingParams | Sequence[SamplingParams] | None",
    count: int,
    what: str,
    default: SamplingParams,
) -> list[SamplingParams]:
    """One `SamplingParams` per prompt: the one given (or `default`) for all, or the list, which
    must have one per prompt."""
    if sampling_params is None or isinstance(sampling_params, SamplingParams):
        return [sampling_params or default] * count
    params = list(sampling_params)
    if len(params) != count:
        raise ValueError(f"sampling_params has {len(params)} entries for {count} {what}")
    for i, p in enumerate(params):
        if not isinstance(p, SamplingParams):
            raise ValueError(f"sampling_params[{i}] must be a SamplingParams, got {p!r}")
    return params


class LLM:
    def __init__(self, model: str, **kwargs: Any) -> None:
        for ours, upstream in UPSTREAM_NAMES.items():
            if upstream in kwargs:
                if ours in kwargs:
                    raise ValueError(f"LLM got both {upstream} and {ours}, one setting")
                kwargs[ours] = kwargs.pop(upstream)
        known = {f.name for f in dataclasses.fields(EngineArgs)}
        unknown = sorted(set(kwargs) - known)
        if unknown:
            raise ValueError(f"LLM got unknown arguments {unknown}; see EngineArgs for the list")
        self.llm_engine = LLMEngine.from_engine_args(EngineArgs(model=model, **kwargs))
        self._ids = itertools.count()

    def get_tokenizer(self):
        return self.llm_engine.tokenizer

    def get_default_sampling_params(self) -> SamplingParams:
        """What `generate` and `chat` use without sampling params: vLLM's defaults, with those
        the model's generation config sets (vllm/config/generation.py), as upstream."""
        defaults = self.llm_engine.config.model_config.generation_config.sampling_defaults
        return SamplingParams(**defaults)

    def generate(
        self,
        prompts: "Prompt | Sequence[Prompt]",
        sampling_params: "SamplingParams | Sequence[SamplingParams] | None" = None,
        use_tqdm: bool | Callable[..., tqdm] = True,
    ) -> list[RequestOutput]:
        """Generate for every prompt (text, token ids, `{"prompt": text}` or
        `{"prompt_token_ids": ids}`); outputs in prompt order. One `SamplingParams` for all, or
        one per prompt. A bad prompt raises `ValueError` naming its index. `use_tqdm`: show a
        progress bar, or a callable that makes one (called with `total` and `desc`)."""
        if isinstance(prompts, str | dict) or (
            isinstance(prompts, list) and prompts and isinstance(prompts[0], numbers.Integral)
        ):
            prompts = [prompts]
        if not isinstance(prompts, Iterable):
            raise ValueError(
                f"prompts must be a prompt or a sequence of prompts, got {type(prompts).__name__}"
            )
        prompts = list(prompts)
        params = _per_prompt(
            sampling_params, len(prompts), "prompts", self.get_default_sampling_params()
        )
        return self._run(prompts, params, use_tqdm)

    def chat(
        self,
        messages: "list[dict[str, str]] | list[list[dict[str, str]]]",
        sampling_params: "SamplingParams | Sequence[SamplingParams] | None" = None,
        use_tqdm: bool | Callable[..., tqdm] = True,
        add_generation_prompt: bool = True,
        chat_template_kwargs: dict[str, Any] | None = None,
        tools: list[dict[str, Any]] | None = None,
        continue_final_message: bool = False,
        chat_template: str | None = None,
    ) -> list[RequestOutput]:
        """Generate replies to one conversation (a list of `{"role", "content"}` messages) or a
        list of them, rendered with `chat_template` (default: the tokenizer's). `tools` is passed
        to the template (as the server's request field; no tool-call parsing);
        `chat_template_kwargs` win over it and over `add_generation_prompt` and
        `continue_final_message` (which leaves the final message open for the reply to
        continue, whatever its role, as upstream: a user's text is completed as the user's; not
        with a generation prompt: set `add_generation_prompt=False`)."""
        tokenizer = self.get_tokenizer()
        if tokenizer is None:
            raise ValueError("chat needs a tokenizer (skip_tokenizer_init is set)")
        if not isinstance(messages, list | tuple):
            raise ValueError(
                "messages must be a conversation (a list of message dicts) or a list of them, "
                f"got {type(messages).__name__}"
            )
        # Tuples are sequences here as upstream's `Sequence` types have them; the template
        # renderer takes lists.
        if messages and isinstance(messages[0], dict):
            messages = [messages]
        conversations = [list(c) if isinstance(c, tuple) else c for c in messages]
        kwargs = tokenizer.chat_template_arguments(
            add_generation_prompt, chat_template_kwargs, continue_final_message
        )
        if tools:
            kwargs.setdefault("tools", tools)
        if chat_template is not None:
            kwargs["chat_template"] = chat_template
        params = _per_prompt(
            sampling_params, len(conversations), "conversations", self.get_default_sampling_params()
        )
        prompts, texts = [], []
        for index, conversation in enumerate(conversations):
            try:
                text = tokenizer.apply_chat_template(conversation, tokenize=False, **kwargs)
                # What `tokenize=True` gives: the rendering holds its special tokens already.
                prompts.append(tokenizer.encode(text, add_special_tokens=False))
            except ValueError as e:
                raise ValueError(f"conversation {index}: {e}") from None
            texts.append(text)
        return self._run(prompts, params, use_tqdm, "conversation", texts)

    def _run(
        self,
        prompts: list[Prompt],
        params: list[SamplingParams],
        use_tqdm: bool | Callable[..., tqdm],
        what: str = "prompt",
        texts: list[str] | None = None,
    ) -> list[RequestOutput]:
        engine = self.llm_engine
        order = {}
        try:
            for index, (prompt, p) in enumerate(zip(prompts, params, strict=True)):
                request_id = str(next(self._ids))
                # Only final outputs are read here: the engine need not build the others.
                final_only = dataclasses.replace(p, output_kind=RequestOutputKind.FINAL_ONLY)
                try:
                    inputs, text = _unpack(prompt)
                    if texts is not None:
                        text = texts[index]
                    engine.add_request(request_id, inputs, final_only, text)
                except ValueError as e:
                    raise ValueError(f"{what} {index}: {e}") from None
                order[request_id] = len(order)
        except BaseException:  # a bad prompt, or Ctrl-C while a long batch is added
            engine.abort_request(list(order))
            raise
        results: dict[str, RequestOutput] = {}
        if callable(use_tqdm):  # a bar factory, as upstream (`functools.partial(tqdm, ...)`)
            bar = use_tqdm(total=len(order), desc="Processed prompts")
        else:
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
        """Stop tensor-parallel workers (also done at interpreter exit, and when the `LLM` is
        collected)."""
        self.llm_engine.shutdown()

    def __del__(self, _is_finalizing=sys.is_finalizing) -> None:
        engine = getattr(self, "llm_engine", None)
        # At interpreter exit module globals (`sys` too: hence the default argument) may already
        # be gone; the executor's exit hook has stopped the workers by then.
        if engine is not None and not _is_finalizing():
            engine.shutdown()
