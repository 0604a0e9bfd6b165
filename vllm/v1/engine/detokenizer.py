"""Incremental detokenization of one sequence: its text, stop strings, and what to stream.

Each step decodes only a small window of recent tokens, the only ones kept: `_ids[:_read]` are
tokens whose text is already final (decoded as context; their `_prefix_len` characters are
subtracted) and `_ids[_read:]` are pending: their text is appended as soon as it is stable, i.e. up
to any trailing U+FFFD, which may be a character whose remaining bytes are in tokens not sampled
yet. When the pending text ends cleanly the window slides forward, so for byte-level tokenizers
`output_text` ends up equal to `tokenizer.decode(output ids)` without re-decoding the whole output
per token.
"""

from vllm.transformers_utils.tokenizer import Tokenizer

_REPLACEMENT = "\ufffd"
# Prompt tokens decoded ahead of the output: decoders that drop the leading space of a decode
# (SentencePiece) then keep the first output token's.
_PROMPT_CONTEXT = 4
# An unfinished UTF-8 character has at most 3 of its bytes, so it lies in the last 3 tokens (tokens
# without text that a decode would join it across are kept out of the window: `_joins_across`).
_UNFINISHED_TOKENS = 3
# Pending text still ending in U+FFFD after this many tokens holds invalid bytes rather than an
# unfinished character; the window is then cut short of its last tokens to stay bounded.
_MAX_PENDING = 8


class IncrementalDetokenizer:
    """Text of one sequence, token by token, with stop-string matching and streaming hold-back."""

    def __init__(
        self,
        tokenizer: Tokenizer,
        prompt_token_ids: list[int],
        stop: list[str],
        include_stop_str_in_output: bool,
        skip_special_tokens: bool = True,
        min_tokens: int = 0,
    ) -> None:
        if not isinstance(prompt_token_ids, list):
            raise ValueError("prompt_token_ids must be a list of token ids")
        if not isinstance(stop, list) or not all(isinstance(s, str) and s for s in stop):
            raise ValueError(f"stop must be a list of non-empty strings, got {stop!r}")
        self.tokenizer = tokenizer
        self.stop = stop
        self.include_stop_str_in_output = include_stop_str_in_output
        self.skip_special_tokens = skip_special_tokens
        # Like eos and stop token ids, stop strings do not end the first `min_tokens` tokens: only
        # a match ending in the text of a later token counts.
        self.min_tokens = min_tokens
        self._num_tokens = 0
        self.output_text = ""
        self.matched_stop: str | None = None
        # Text that may be the start of a stop string is held back from streaming.
        self._holdback = max((len(s) for s in stop), default=1) - 1
        self._sent = 0
        context = prompt_token_ids[-_PROMPT_CONTEXT:]
        context_text = self._decode(context)
        if context_text.endswith(_REPLACEMENT):
            # The prompt ends inside a character: decode the output on its own, as a full decode
            # of the output ids would.
            context, context_text = [], ""
        self._ids = list(context)
        self._read = len(context)
        self._prefix_len = len(context_text)
        self._emitted = 0  # characters of the pending text already in output_text
        self._unfinished = False  # the pending text ends in U+FFFD

    def update(self, new_token_ids: list[int]) -> str | None:
        """Append tokens and their text; return the stop string that matched, if one did."""
        if not isinstance(new_token_ids, list):
            raise ValueError("new_token_ids must be a list of token ids")
        if self.matched_stop is not None:
            raise ValueError(
                f"new_token_ids: the sequence already stopped at {self.matched_stop!r}"
            )
        self._num_tokens += len(new_token_ids)
        for token in new_token_ids:
            if not (self._unfinished and self._joins_across(token)):
                self._ids.append(token)
        before = len(self.output_text)
        text = self._decode(self._ids)
        pending = text[self._prefix_len :]
        stable = len(pending.rstrip(_REPLACEMENT))
        self._emit(pending, stable)
        self._unfinished = stable < len(pending)
        if stable == len(pending):
            self._slide()
        elif len(self._ids) - self._read > _MAX_PENDING:
            self._cut(text)
        if len(self.output_text) == before or self._num_tokens <= self.min_tokens:
            return None
        return self._find_stop(before)

    def get_next_output_text(self, finished: bool, delta: bool) -> str:
        """Text to stream now: new text since the last call if `delta`, else all text so far.

        Until `finished`, the last (longest stop - 1) characters are withheld, as a stop string may
        be starting there; once finished, everything remains to be sent, including a character
        that never completed (as U+FFFD, as a full decode shows it).
        """
        if finished and self.matched_stop is None:
            pending = self._decode(self._ids)[self._prefix_len :]
            self._emit(pending, len(pending))
        end = len(self.output_text)
        if not finished and self.matched_stop is None:
            end = max(self._sent, end - self._holdback)
        start, self._sent = self._sent, end
        return self.output_text[start:end] if delta else self.output_text[:end]

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=self.skip_special_tokens)

    def _emit(self, pending: str, end: int) -> None:
        if end > self._emitted:
            self.output_text += pending[self._emitted : end]
            self._emitted = end

    def _slide(self) -> None:
        """Make the pending tokens (all emitted) the context of the next ones."""
        del self._ids[: self._read]  # final text that no later token can change
        self._read = len(self._ids)
        self._prefix_len = len(self._decode(self._ids))
        self._emitted = 0

    def _cut(self, text: str) -> None:
        """Finalise the pending text up to a token boundary where the decode splits exactly."""
        last = len(self._ids) - _UNFINISHED_TOKENS
        # Invalid sequences span at most 3 bytes, so one of 4 consecutive boundaries splits them.
        for k in range(last, last - 4, -1):
            head = self._decode(self._ids[:k])
            if head + self._decode(self._ids[k:]) == text:
                head_len = len(head) - self._prefix_len
                self._emit(text[self._prefix_len :], head_len)
                del self._ids[:k]
                self._read = 0
                self._prefix_len = 0
                self._emitted -= head_len
                return

    def _joins_across(self, token: int) -> bool:
        """Whether `token` has no text and the window decodes the same with it: a skipped special
        token or an id past the vocabulary, which a decode joins an unfinished character's bytes
        across. Left out of the window, such tokens cannot push the character's first bytes out
        of the last `_UNFINISHED_TOKENS`, nor grow the window while the character is pending."""
        if self._decode([token]):
            return False
        return self._decode([*self._ids, token]) == self._decode(self._ids)

    def _find_stop(self, before: int) -> str | None:
        # Only a match ending in the new text is new: it starts at most len(s) - 1 chars before
        # it. Searching from further back could find a match wholly in older text, which exists
        # when that text came from the first `min_tokens` tokens, whose matches do not count.
        found = [
            (i, len(s), s)
            for s in self.stop
            if (i := self.output_text.find(s, max(0, before - len(s) + 1))) >= 0
        ]
        if not found:
            return None
        index, length, stop = min(found)
        end = index + length if self.include_stop_str_in_output else index
        self.output_text = self.output_text[:end]
        self.matched_stop = stop
        return stop
