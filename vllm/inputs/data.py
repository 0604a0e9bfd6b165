"""The dict prompts `LLM.generate` takes besides text and token ids, as upstream names them.

Only the keys this engine reads are declared (and `cache_salt`, accepted and unused: no prefix
cache is shared between requests). Upstream's other optional keys are accepted by `generate`
when null and refused by name otherwise (vllm/entrypoints/llm.py)."""

from typing import NotRequired, TypedDict

__all__ = ["PromptType", "TextPrompt", "TokensPrompt"]


class TextPrompt(TypedDict):
    """A prompt as text, tokenized by the engine (special tokens added as the tokenizer does)."""

    prompt: str
    cache_salt: NotRequired[str]


class TokensPrompt(TypedDict):
    """A prompt as token ids, used as given; `prompt` is the text the outputs report for it."""

    prompt_token_ids: list[int]
    prompt: NotRequired[str]
    cache_salt: NotRequired[str]


# As upstream's (token ids alone are a TokensPrompt there; `LLM.generate` also takes a bare list).
PromptType = str | TextPrompt | TokensPrompt
