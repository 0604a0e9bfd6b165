"""IncrementalDetokenizer on the tiny byte-level tokenizer: UTF-8 split across tokens, stop strings,
streaming hold-back, a random-token soak against a full decode, and random short streams (stop
strings, min_tokens, include_stop_str_in_output, skip_special_tokens) against the definition."""

import base64
import json
import random

import pytest

from vllm.model_executor.model_loader.builtin import BUILTIN_MODELS
from vllm.transformers_utils.tokenizer import get_tokenizer
from vllm.v1.engine.detokenizer import IncrementalDetokenizer

TOK = get_tokenizer(BUILTIN_MODELS["kimi-linear-tiny"])
BOS, EOS = TOK.bos_token_id, TOK.eos_token_id
PROMPT = TOK.encode("Say:")


class SpyTokenizer:
    """Records the longest id list that was decoded in one call."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.longest = 0

    def decode(self, ids, skip_special_tokens=True):
        self.longest = max(self.longest, len(ids))
        return self.tokenizer.decode(ids, skip_special_tokens=skip_special_tokens)


def stream(ids, stop=(), include=False, chunk=1, prompt=PROMPT, tokenizer=TOK, skip=True):
    """Feed `ids` `chunk` at a time; return (detokenizer, deltas, matched stop)."""
    det = IncrementalDetokenizer(tokenizer, prompt, list(stop), include, skip)
    deltas, matched = [], None
    for i in range(0, len(ids), chunk):
        matched = det.update(ids[i : i + chunk])
        if matched is not None:
            break
        deltas.append(det.get_next_output_text(finished=False, delta=True))
    deltas.append(det.get_next_output_text(finished=True, delta=True))
    return det, deltas, matched


@pytest.mark.parametrize("text", ["a世", "é🙂 中文, ok 👍🏽", "🙂" * 5, "x\n世界\t€"])
def test_multibyte_characters_split_across_byte_tokens(text):
    ids = TOK.encode(text)
    assert len(ids) == len(text.encode())  # one byte per token: characters really are split
    det, deltas, matched = stream(ids)
    assert matched is None
    assert not any("\ufffd" in d for d in deltas)
    assert "".join(deltas) == det.output_text == TOK.decode(ids) == text
    # Each character is streamed by the token that completes it, not later.
    chars = [d for d in deltas[:-1] if d]
    assert chars == list(text) and deltas[-1] == ""


def test_a_character_that_never_completes_shows_at_finish():
    ids = TOK.encode("ok世")[:-1]
    det, deltas, _ = stream(ids)
    assert deltas[:-1] == ["o", "k", "", ""]
    assert deltas[-1] == "\ufffd" and det.output_text == TOK.decode(ids) == "ok\ufffd"


@pytest.mark.parametrize("gap", [[BOS] * 10, [300] * 10, [BOS, 300] * 4 + [EOS]])
def test_tokens_without_text_between_bytes_of_a_character(gap):
    # Skipped special tokens and ids past the vocabulary decode to nothing, so the character's
    # bytes still join however many of them come between.
    first, second, last = TOK.encode("।")
    ids = TOK.encode("x") + [first, second, *gap, last] + TOK.encode("y")
    det, deltas, _ = stream(ids)
    assert det.output_text == "".join(deltas) == TOK.decode(ids) == "x।y"
    assert "\ufffd" not in "".join(deltas)


def test_tokens_without_text_after_an_unfinished_character_keep_the_window_bounded():
    # An ignore_eos run that repeats a skipped special token after a character's first byte: each
    # step decodes a few ids, however long the run, and the character still completes.
    lead, *rest = TOK.encode("世")
    ids = TOK.encode("x") + [lead] + [BOS] * 300 + rest + TOK.encode("y")
    spy = SpyTokenizer(TOK)
    det, deltas, _ = stream(ids, tokenizer=spy)
    assert det.output_text == "".join(deltas) == TOK.decode(ids) == "x世y"
    assert spy.longest <= 12  # the prompt context and a few pending tokens, not the run


def test_prompt_ending_inside_a_character():
    prompt = TOK.encode("x世")[:-1]
    det, deltas, _ = stream(TOK.encode("世")[-1:] + TOK.encode("ab"), prompt=prompt)
    assert det.output_text == "".join(deltas) == "\ufffdab"


@pytest.mark.parametrize("include", [False, True])
@pytest.mark.parametrize("chunk", [1, 2, 5])
def test_stop_string_across_token_boundaries(include, chunk):
    ids = TOK.encode("hello 世STOP界 world")
    det, deltas, matched = stream(ids, stop=["STOP"], include=include, chunk=chunk)
    assert matched == "STOP" == det.matched_stop
    expected = "hello 世STOP" if include else "hello 世"
    assert det.output_text == expected
    assert "".join(deltas) == expected
    # Nothing of the stop string is streamed before it is known to match.
    streamed_early = "".join(deltas[:-1])
    assert "S" not in streamed_early


def test_multibyte_stop_string():
    det, _, matched = stream(TOK.encode("ab世界cd"), stop=["世界"])
    assert matched == "世界" and det.output_text == "ab"


def test_first_match_in_text_order_wins():
    ids = TOK.encode("hello world")
    for chunk in (1, len(ids)):
        det, _, matched = stream(ids, stop=["world", "lo w"], chunk=chunk)
        assert matched == "lo w" and det.output_text == "hel"
    # At the same position the shorter one completes first.
    det, _, matched = stream(ids, stop=["llo", "ll"], include=True, chunk=len(ids))
    assert matched == "ll" and det.output_text == "hell"


@pytest.mark.parametrize("include", [False, True])
def test_stop_at_the_very_start(include):
    det, deltas, matched = stream(TOK.encode("hello"), stop=["he"], include=include)
    assert matched == "he"
    assert det.output_text == "".join(deltas) == ("he" if include else "")


def test_min_tokens_ignores_a_shorter_stop_wholly_in_their_text():
    # "ab" is in the text of the first min_tokens tokens; the longer stop widens the search
    # window enough to reach back to it once the next token arrives.
    det = IncrementalDetokenizer(TOK, PROMPT, ["ab", "zzzzz"], False, min_tokens=2)
    for token in TOK.encode("abcd"):
        assert det.update([token]) is None
    assert det.output_text == "abcd"
    # A match that straddles the boundary ends in a later token's text: it counts.
    det = IncrementalDetokenizer(TOK, PROMPT, ["bc", "zzzzz"], False, min_tokens=2)
    assert [det.update([t]) for t in TOK.encode("abc")] == [None, None, "bc"]
    assert det.output_text == "a"


def test_holdback_while_not_finished():
    det = IncrementalDetokenizer(TOK, PROMPT, ["STOP", "x"], False)
    assert det.update(TOK.encode("hello")) is None
    assert det.get_next_output_text(finished=False, delta=True) == "he"
    assert det.get_next_output_text(finished=False, delta=False) == "he"
    assert det.update(TOK.encode(" S")) is None
    assert det.get_next_output_text(finished=False, delta=True) == "ll"
    assert det.get_next_output_text(finished=False, delta=False) == "hell"
    assert det.get_next_output_text(finished=True, delta=True) == "o S"
    assert det.output_text == "hello S"


def test_special_tokens_are_skipped_or_kept():
    ids = [BOS, *TOK.encode("hi"), EOS]
    det, deltas, _ = stream(ids)
    assert det.output_text == "".join(deltas) == "hi"
    det, deltas, _ = stream(ids, skip=False)
    assert det.output_text == "".join(deltas) == "<|bos|>hi<|eos|>"


@pytest.fixture
def merged(tmp_path):
    """A Kimi-format tokenizer whose merges "a\xe4" and "\xb8\x96" split 世 (e4 b8 96) mid-token."""
    tokens = [bytes([b]) for b in range(256)] + [b"a\xe4", b"\xb8\x96", b"\x96\xe4\xb8"]
    lines = [f"{base64.b64encode(t).decode()} {rank}" for rank, t in enumerate(tokens)]
    (tmp_path / "tiktoken.model").write_text("\n".join(lines))
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"eos_token": "[EOS]"}))
    return get_tokenizer(tmp_path)


def test_merged_tokens_holding_part_of_a_character(merged):
    det, deltas, _ = stream([256, 257, ord("!")], tokenizer=merged, prompt=[])
    assert deltas == ["a", "世", "!", ""]


def test_soak_merged_tokens_match_full_decode(merged):
    rng = random.Random(5)
    ids = [
        rng.choice([256, 257, 258, 0xE4, 0xB8, 0x96, 0x61, rng.randrange(515)]) for _ in range(3000)
    ]
    det, streamed, longest = soak(ids, rng, tokenizer=merged)
    assert det.output_text == streamed == merged.decode(ids)
    assert longest <= 30


def soak(ids, chunk_rng, stop=(), skip=True, tokenizer=TOK):
    spy = SpyTokenizer(tokenizer)
    det = IncrementalDetokenizer(spy, PROMPT, list(stop), False, skip)
    streamed, i = [], 0
    while i < len(ids):
        n = chunk_rng.randint(1, 3)
        det.update(ids[i : i + n])
        i += n
        streamed.append(det.get_next_output_text(finished=False, delta=True))
    streamed.append(det.get_next_output_text(finished=True, delta=True))
    return det, "".join(streamed), spy.longest


@pytest.mark.parametrize("skip", [True, False])
def test_soak_random_tokens_match_full_decode(skip):
    rng = random.Random(1234)
    # Any id the tiny model can sample: bytes, specials, and ids past the tokenizer (< 320).
    ids = [
        rng.randrange(320) if rng.random() < 0.3 else rng.randrange(128, 256) for _ in range(4000)
    ]
    det, streamed, longest = soak(ids, rng, skip=skip)
    assert det.output_text == streamed == TOK.decode(ids, skip_special_tokens=skip)
    assert longest <= 30  # the window stays bounded


def test_soak_random_text_never_streams_a_broken_character():
    rng = random.Random(7)
    alphabet = "ab c\n世界中文é€🙂👍🏽"
    text = "".join(rng.choice(alphabet) for _ in range(3000))
    det, streamed, longest = soak(TOK.encode(text), rng, stop=["never"])
    assert "\ufffd" not in streamed
    assert det.output_text == streamed == text
    assert longest <= 30


def test_bad_input():
    with pytest.raises(ValueError, match="stop"):
        IncrementalDetokenizer(TOK, PROMPT, [""], False)
    with pytest.raises(ValueError, match="stop"):
        IncrementalDetokenizer(TOK, PROMPT, "STOP", False)
    with pytest.raises(ValueError, match="prompt_token_ids"):
        IncrementalDetokenizer(TOK, (1, 2), [], False)
    det = IncrementalDetokenizer(TOK, PROMPT, ["b"], False)
    with pytest.raises(ValueError, match="new_token_ids"):
        det.update(5)
    assert det.update(TOK.encode("ab")) == "b"
    with pytest.raises(ValueError, match="new_token_ids"):
        det.update(TOK.encode("c"))


def _random_ids(rng, n):
    """Ids biased towards what breaks detokenizers: bytes of multi-byte characters, stray high
    bytes, special tokens, ids past the tokenizer, whitespace."""
    pieces = [b for ch in "é世🙂€ab c\n" for b in TOK.encode(ch)]
    kinds = [
        lambda: rng.choice(pieces),
        lambda: rng.randrange(128, 256),
        lambda: rng.choice([BOS, EOS, 258, 300, *TOK.encode(" \n\t")]),
        lambda: rng.randrange(256),
    ]
    return [rng.choice(kinds)() for _ in range(n)]


def _expected_stop(ids, stop, include, skip, min_tokens):
    """(tokens fed, stop, text) by definition: the first token after `min_tokens` whose stable
    text (a full decode less a trailing unfinished character) completes a stop string; of those,
    the one starting first, the shorter at a tie. (None, None, full decode) if none does."""
    before = ""
    for k in range(1, len(ids) + 1):
        text = TOK.decode(ids[:k], skip_special_tokens=skip).rstrip("\ufffd")
        if k > min_tokens and len(text) > len(before):
            # Every occurrence, overlapping ones too, that ends in this token's new text.
            found = [
                (i, len(s), s)
                for s in stop
                for i in range(len(text) - len(s) + 1)
                if text.startswith(s, i) and i + len(s) > len(before)
            ]
            if found:
                i, length, s = min(found)
                return k, s, text[: i + length if include else i]
        before = max(before, text, key=len)
    return None, None, TOK.decode(ids, skip_special_tokens=skip)


def test_random_streams_match_the_definition():
    rng = random.Random(2024)
    for _ in range(300):
        ids = _random_ids(rng, rng.randrange(1, 40))
        skip, include = rng.random() < 0.5, rng.random() < 0.5
        clean = TOK.decode(ids, skip_special_tokens=skip).replace("\ufffd", "")
        stop = []
        for _ in range(rng.randrange(4)):  # substrings of the output, some across tokens
            if clean and rng.random() < 0.8:
                a = rng.randrange(len(clean))
                stop.append(clean[a : rng.randrange(a + 1, min(len(clean), a + 8) + 1)])
            else:
                stop.append(rng.choice(["zz", "<|eos|>", " ", "\n\n"]))
        min_tokens = rng.choice([0, 0, 1, 3, len(ids) // 2])
        det = IncrementalDetokenizer(TOK, _random_ids(rng, 5), stop, include, skip, min_tokens)
        deltas, fed, matched = [], 0, None
        while fed < len(ids) and matched is None:
            matched = det.update(ids[fed : fed + 1])
            fed += 1
            deltas.append(det.get_next_output_text(finished=matched is not None, delta=True))
        if matched is None:
            deltas.append(det.get_next_output_text(finished=True, delta=True))
        case = (ids, stop, include, skip, min_tokens)
        expected_fed, expected_stop, expected_text = _expected_stop(*case)
        assert matched == expected_stop, case
        assert det.output_text == expected_text, case
        assert fed == (expected_fed or len(ids)), case
        # Deltas only append: nothing streamed before the stop lies past where it cut the text.
        assert "".join(deltas) == det.output_text, case
