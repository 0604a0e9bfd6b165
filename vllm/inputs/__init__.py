"""Upstream's prompt types for `LLM.generate` / `LLM.chat` (`from vllm.inputs import TokensPrompt`):
typed dicts of the keys this engine reads (vllm/inputs/data.py)."""

from vllm.inputs.data import PromptType, TextPrompt, TokensPrompt

__all__ = ["PromptType", "TextPrompt", "TokensPrompt"]
