"""The kimi_k3 reasoning parser: markers removed, prompt-opened blocks, and streaming that only
ever appends (held-back partial markers) while ending equal to the one-shot split."""

import random
from types import SimpleNamespace

import pytest

from vllm.reasoning import REASONING_PARSERS
from vllm.reasoning.kimi_k3_reasoning_parser import THINK_END, THINK_START, KimiK3ReasoningParser


def _parser(special: bool = False) -> KimiK3ReasoningParser:
    ids = {"<|open|>": 300, "<|close|>": 301, "<|sep|>": 302}
    tokenizer = SimpleNamespace(
        all_special_ids=list(ids.values()) if special else [], token_to_id=ids.get
    )
    return KimiK3ReasoningParser(tokenizer)


def test_registered_under_recipe_name() -> None:
    assert REASONING_PARSERS["kimi_k3"] is KimiK3ReasoningParser


@pytest.mark.parametrize(
    "text, in_reasoning, expected",
    [
        ("plain answer", False, ("", "plain answer")),
        (f"{THINK_START}let me see{THINK_END}42", False, ("let me see", "42")),
        (f"pre {THINK_START}a{THINK_END} mid {THINK_START}b{THINK_END}end", False,
         ("ab", "pre  mid end")),
        (f"thinking{THINK_END}answer", True, ("thinking", "answer")),
        ("still thinking", True, ("still thinking", "")),
        (f"{THINK_START}unclosed", False, ("unclosed", "")),
    ],
)  # fmt: skip
def test_split(text: str, in_reasoning: bool, expected: tuple[str, str]) -> None:
    assert _parser().split(text, in_reasoning) == expected


def test_starts_in_reasoning_only_for_an_open_block() -> None:
    parser = _parser()
    assert parser.starts_in_reasoning(f"user: hi\nassistant: {THINK_START}")
    assert not parser.starts_in_reasoning(f"{THINK_START}old{THINK_END}\nassistant: ")
    assert not parser.starts_in_reasoning("assistant: ")


def test_needs_special_tokens_when_markers_are_special() -> None:
    assert _parser(special=True).needs_special_tokens
    assert not _parser(special=False).needs_special_tokens


def test_streaming_appends_only_and_matches_final_split() -> None:
    rng = random.Random(1234)
    parser = _parser()
    pieces = ["Hi ", THINK_START, "step one, ", "<|cl", "ose|> is not a marker; ", THINK_END,
              "The answer", " is 7.", THINK_START, "again", THINK_END, "done"]  # fmt: skip
    text = "".join(pieces)
    for _ in range(50):
        cuts = sorted(rng.sample(range(1, len(text)), 12))
        reasoning, content = "", ""
        for end in [*cuts, len(text)]:
            final = end == len(text)
            r, c = parser.split(text[:end], False, final)
            assert r.startswith(reasoning) and c.startswith(content), (text[:end], r, c)
            reasoning, content = r, c
        assert (reasoning, content) == parser.split(text, False)
    assert parser.split(text, False) == (
        "step one, <|close|> is not a marker; again",
        "Hi The answer is 7.done",
    )


def test_partial_marker_is_held_back_only_while_streaming() -> None:
    parser = _parser()
    assert parser.split("answer <|op", False, final=False) == ("", "answer ")
    assert parser.split("answer <|op", False, final=True) == ("", "answer <|op")
