"""Kimi-K3's think channel: `<|open|>think<|sep|> ... <|close|>think<|sep|>`.

Text inside a think block is reasoning, the rest is content. When the chat template already opens
the block at the end of the prompt, the reply starts inside it. The parser works on the cumulative
text of a reply, so one function serves the final response and streaming: while streaming, a tail
that could still grow into a marker is held back, which keeps both parts append-only (each delta
is the new suffix of the reasoning or of the content).
"""

from typing import Any

THINK_START = "<|open|>think<|sep|>"
THINK_END = "<|close|>think<|sep|>"


def _partial_marker_len(text: str, marker: str) -> int:
    """Length of the longest suffix of `text` that is a proper prefix of `marker`."""
    for k in range(min(len(marker) - 1, len(text)), 0, -1):
        if text.endswith(marker[:k]):
            return k
    return 0


class KimiK3ReasoningParser:
    start = THINK_START
    end = THINK_END

    def __init__(self, tokenizer: Any) -> None:
        # Kimi-K3 tokenizers have the markers' pieces as special tokens, which detokenization
        # would drop; they must then be kept to be found.
        special = set(getattr(tokenizer, "all_special_ids", []) or [])
        marker_ids = [tokenizer.token_to_id(t) for t in ("<|open|>", "<|close|>", "<|sep|>")]
        self.needs_special_tokens = any(i is not None and i in special for i in marker_ids)

    def starts_in_reasoning(self, prompt_text: str) -> bool:
        """Whether the prompt leaves the reply inside an open think block."""
        last_start = prompt_text.rfind(self.start)
        return last_start >= 0 and prompt_text.find(self.end, last_start) < 0

    def split(self, text: str, in_reasoning: bool, final: bool = True) -> tuple[str, str]:
        """(reasoning, content) of a reply's cumulative `text`; markers removed. Unless `final`,
        a trailing partial marker is left out of both."""
        reasoning: list[str] = []
        content: list[str] = []
        pos = 0
        while True:
            marker = self.end if in_reasoning else self.start
            found = text.find(marker, pos)
            if found < 0:
                break
            (reasoning if in_reasoning else content).append(text[pos:found])
            pos = found + len(marker)
            in_reasoning = not in_reasoning
        tail = text[pos:]
        if not final:
            held = _partial_marker_len(tail, self.end if in_reasoning else self.start)
            tail = tail[: len(tail) - held]
        (reasoning if in_reasoning else content).append(tail)
        return "".join(reasoning), "".join(content)
