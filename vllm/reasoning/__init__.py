"""Reasoning parsers: split a chat reply's thinking from its answer (`--reasoning-parser`)."""

from vllm.reasoning.kimi_k3_reasoning_parser import KimiK3ReasoningParser

REASONING_PARSERS = {"kimi_k3": KimiK3ReasoningParser}

__all__ = ["REASONING_PARSERS", "KimiK3ReasoningParser"]
