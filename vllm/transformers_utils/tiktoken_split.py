"""How Kimi's tiktoken tokenizer cuts text before encoding it, and where special tokens sit in it.

Kimi-Linear's `tokenization_kimi.py`, run through HF, splits special tokens off first, then cuts
each text between them every `MAX_ENCODE_CHARS` characters and each such chunk inside runs of
whitespace or non-whitespace longer than `MAX_RUN_CHARS`. The cuts decide the token ids, so
`TiktokenTokenizer` (tokenizer.py) makes the same ones. Every scan here is bounded (`SCAN_CHARS`)
so that a long prompt holds the GIL only briefly: the server tokenizes on a worker thread beside
its event loop.
"""

import re
from collections.abc import Iterator

# tiktoken panics past ~400k characters in one call and turns quadratic on very long runs of
# whitespace or non-whitespace, so text is encoded in pieces cut at these lengths (as Kimi does).
# The cuts decide the token ids: changing them changes how a long prompt is tokenized.
MAX_ENCODE_CHARS = 400_000
MAX_RUN_CHARS = 25_000
# Most characters one `re` call scans while following a long run to its end (0.1 ms): the
# GIL is held through a C call, and passes to other threads only between such calls.
SCAN_CHARS = 1 << 16
_SPACE = re.compile(r"\s")
_SPACES = re.compile(r"\s*")
_NON_SPACES = re.compile(r"\S*")


def _run_end(same: re.Pattern, text: str, pos: int) -> int:
    """Where the run of `same`'s characters from `pos` on ends in `text`, matched `SCAN_CHARS`
    characters per call."""
    while True:
        stop = min(pos + SCAN_CHARS, len(text))
        end = same.match(text, pos, stop).end()
        if end < stop or stop == len(text):
            return end
        pos = stop


def _long_runs(text: str) -> Iterator[tuple[int, int]]:
    """Start and end of each run of whitespace or of non-whitespace in `text` (whole: the
    characters around it are of the other kind) of at least `MAX_RUN_CHARS` characters.

    Such a run covers a multiple of `MAX_RUN_CHARS`, so only the runs through those positions
    are measured, mostly a word or a space long. One regex pass over the whole text found the
    same runs, but at 1 s per 23 MB in a single C call, which holds the GIL: the server's event
    loop stood still that long although it tokenizes on a worker thread. Here no `re` call
    scans more than `MAX_RUN_CHARS` or `SCAN_CHARS` characters; 23 MB take 10 ms (prose) to
    65 ms (runs of 25k characters).
    """
    end = 0
    for at in range(0, len(text), MAX_RUN_CHARS):
        if at < end:  # inside the long run found last
            continue
        same = _SPACES if _SPACE.match(text, at) else _NON_SPACES
        # The run began after the previous multiple: one through both would have been found
        # there, and `at` skipped. Its characters before `at`, counted backwards:
        start = at - same.match(text[max(0, at - MAX_RUN_CHARS + 1) : at][::-1]).end()
        end = _run_end(same, text, at)
        if end - start >= MAX_RUN_CHARS:
            yield start, end


def split_for_tiktoken(text: str) -> list[str]:
    """`text` cut every `MAX_ENCODE_CHARS` characters, then each such chunk every
    `MAX_RUN_CHARS` characters of a long run counted from the run's start in the chunk: Kimi
    measures the runs of each chunk on its own, so a run that crosses a chunk's end is counted
    afresh from there (counted from its start in the text, it was cut elsewhere: other ids)."""
    pieces = []
    for at in range(0, len(text), MAX_ENCODE_CHARS):
        chunk = text[at : at + MAX_ENCODE_CHARS]
        cuts = set()
        for start, end in _long_runs(chunk):
            cuts.update(range(start + MAX_RUN_CHARS, end, MAX_RUN_CHARS))
        bounds = [0, *sorted(cuts), len(chunk)]
        pieces += [chunk[a:b] for a, b in zip(bounds, bounds[1:], strict=False)]
    return pieces


def trie_pattern(words: list[str]) -> str:
    """A regex matching any of `words`, the longest at a position, as a trie of alternations:
    at a character a word may start with, one alternative per next character is tried, where
    a flat alternation tries every word (the 256 Kimi specials: 3 ms per 64k characters of
    text rich in "<|" and "[", ten times the trie's)."""
    tree: dict[str, dict] = {}
    for word in words:
        node = tree
        for char in word:
            node = node.setdefault(char, {})
        node[""] = {}  # a word ends here

    def alternation(node: dict[str, dict]) -> str:
        # A word ending here goes last, so that a longer word through this node wins.
        alts = [re.escape(c) + alternation(child) for c, child in node.items() if c]
        alts += [""] if "" in node else []
        return alts[0] if len(alts) == 1 else f"(?:{'|'.join(alts)})"

    return alternation(tree)


def special_spans(pattern: re.Pattern, longest: int, text: str) -> Iterator[tuple[int, int]]:
    """Start and end of each special token's text in `text` (`pattern` matches them, the longest
    at a position), left to right; no `re` call scans more than `SCAN_CHARS` + `longest`
    characters, so the GIL passes to other threads on a long text (see `_long_runs`)."""
    pos = 0
    while pos < len(text):
        stop = min(pos + SCAN_CHARS, len(text))
        # A token that starts before `stop` ends within `longest - 1` characters past it. One
        # iterator per window: a `search` per token cost a chat of short turns 2 us a token.
        for match in pattern.finditer(text, pos, min(stop + longest - 1, len(text))):
            if match.start() >= stop:
                break
            yield match.span()
            pos = match.end()
        pos = max(pos, stop)
