"""Tokenizer of a checkpoint folder: special tokens, chat template and the info the server shows.

Two formats are read:
- `tokenizer.json`, through the `tokenizers` library (the built-in tiny models, HF checkpoints);
- `tiktoken.model` + `tokenizer_config.json`, the format of the published Kimi checkpoints:
  byte-level BPE ranks ("base64(token bytes) rank" per line) read by `tiktoken`, with Kimi's
  pre-tokenizer split and 256 special-token ids numbered right after the BPE ranks.

Special tokens, the chat template and `model_max_length` come from `tokenizer_config.json` when the
folder has one (the chat template from `chat_template.jinja` first, as HF reads it); otherwise
bos/eos/pad come from `config.json` ids (or its `text_config`). A caller
may render with a chat template of its own instead, and may leave the final message open for the
reply to continue (HF's `continue_final_message`).
"""

import base64
import functools
import json
import re
from abc import ABC, abstractmethod
from pathlib import Path
from typing import Any

import jinja2
import tiktoken
import tokenizers

from vllm.model_executor.model_loader.errors import CheckpointError
from vllm.transformers_utils import tiktoken_split
from vllm.transformers_utils.chat_template import (
    CONTINUE_WITH_GENERATION_PROMPT,
    check_messages,
    compile_chat_template,
    cut_at_stand_in,
    mark_final_message,
    render_within,
    with_reasoning_aliases,
)

# Kimi's split regex (tokenization_kimi.py): CJK ideographs form their own runs, letter runs may
# carry one leading non-letter and an English contraction, digits group by at most three.
KIMI_PAT_STR = "|".join(
    [
        r"""[\p{Han}]+""",
        r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*"""
        r"""[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
        r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+"""
        r"""[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
        r"""\p{N}{1,3}""",
        r""" ?[^\s\p{L}\p{N}]+[\r\n]*""",
        r"""\s*[\r\n]+""",
        r"""\s+(?!\S)""",
        r"""\s+""",
    ]
)
NUM_RESERVED_SPECIAL_TOKENS = 256
# HF writes int(1e30) as model_max_length when a checkpoint sets no limit.
_NO_LIMIT = 10**12


def _byte_to_unicode() -> dict[int, str]:
    """GPT-2's printable stand-in for each byte, so that byte-level tokens read as text."""
    printable = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAC + 1), *range(0xAE, 0xFF + 1)]
    table = {b: chr(b) for b in printable}
    shifted = 0
    for b in range(256):
        if b not in table:
            table[b] = chr(256 + shifted)
            shifted += 1
    return table


_BYTE_TO_UNICODE = _byte_to_unicode()
_UNICODE_TO_BYTE = {c: b for b, c in _BYTE_TO_UNICODE.items()}


def _read_json(path: Path) -> dict:
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"{path}: cannot read it as JSON: {e}") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path} must hold a JSON object")
    return data


def _token_text(value: Any) -> str | None:
    """A special token as tokenizer_config.json writes it: a string or {"content": ...}."""
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else None


class Tokenizer(ABC):
    """Encode/decode plus special tokens, chat template and tokenizer info of one checkpoint.

    Ids outside the vocabulary (models pad their embedding tables beyond it) decode to nothing.
    """

    default_class: str

    def __init__(self, folder: Path) -> None:
        self._config = _read_json(folder / "tokenizer_config.json")
        model_config = _read_json(folder / "config.json")
        self._model_configs = [model_config, model_config.get("text_config") or {}]
        self.bos_token = self._special_text("bos")
        self.eos_token = self._special_text("eos")
        self.pad_token = self._special_text("pad")
        self.chat_template = self._find_chat_template(folder)

    # Backend surface.
    @abstractmethod
    def _encode(self, text: str, add_special_tokens: bool) -> list[int]: ...

    @abstractmethod
    def _decode(self, ids: list[int], skip_special_tokens: bool) -> str: ...

    @abstractmethod
    def _id_to_token(self, token_id: int) -> str: ...

    @abstractmethod
    def token_to_id(self, token: str) -> int | None:
        """The id of a token's text (special tokens by their text), None if there is none."""

    @property
    @abstractmethod
    def vocab_size(self) -> int:
        """Number of ids, special ones included."""

    @property
    @abstractmethod
    def all_special_ids(self) -> list[int]: ...

    # Shared behaviour.
    def is_special(self, token_id: int) -> bool:
        """Whether `token_id` is a special token (what `decode(skip_special_tokens=True)` drops);
        one set lookup, for per-token paths."""
        return token_id in self._special_id_set

    @functools.cached_property
    def _special_id_set(self) -> frozenset[int]:
        return frozenset(self.all_special_ids)

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """Token ids of `text`; special-token text in it becomes the special token. `text` must
        be Unicode that UTF-8 can hold: a lone surrogate (what a JSON `\ud800` escape decodes
        to) is a `ValueError`, where the tokenizers library raises a bare `TypeError` and
        tiktoken would encode it silently."""
        if not isinstance(text, str):
            raise ValueError(f"text must be a str, got {type(text).__name__}")
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as e:
            raise ValueError(
                f"text is not valid Unicode: {e.reason} at character {e.start}"
            ) from None
        return self._encode(text, add_special_tokens)

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        """Text of `ids`; an incomplete UTF-8 sequence decodes to U+FFFD."""
        return self._decode(self._known(ids), skip_special_tokens)

    def token_bytes(self, token_id: int) -> bytes:
        """The bytes one token stands for. A token holding part of a UTF-8 character decodes to
        U+FFFD alone; its bytes are what joins with its neighbours' into the character (the
        `bytes` of OpenAI's chat logprobs). Special tokens: their text; unknown ids: none."""
        text = self.decode([token_id], skip_special_tokens=False)
        if "\ufffd" not in text or self.is_special(token_id):
            return text.encode()
        token = self.convert_ids_to_tokens([token_id])[0]
        byte_fallback = re.fullmatch(r"<0x([0-9A-Fa-f]{2})>", token)  # SentencePiece's
        if byte_fallback:
            return bytes([int(byte_fallback.group(1), 16)])
        if token and all(c in _UNICODE_TO_BYTE for c in token):  # byte-level (GPT-2 alphabet)
            return bytes(_UNICODE_TO_BYTE[c] for c in token)
        return text.encode()

    def convert_ids_to_tokens(self, ids: list[int]) -> list[str]:
        """Each id's token text (byte-level tokens in GPT-2's printable alphabet); "" if unknown."""
        return [self._id_to_token(i) if 0 <= i < self.vocab_size else "" for i in ids]

    @property
    def bos_token_id(self) -> int | None:
        return None if self.bos_token is None else self.token_to_id(self.bos_token)

    @property
    def eos_token_id(self) -> int | None:
        return None if self.eos_token is None else self.token_to_id(self.eos_token)

    @property
    def pad_token_id(self) -> int | None:
        return None if self.pad_token is None else self.token_to_id(self.pad_token)

    @staticmethod
    def chat_template_arguments(
        add_generation_prompt: bool,
        chat_template_kwargs: dict[str, Any] | None,
        continue_final_message: bool = False,
    ) -> dict[str, Any]:
        """Keywords for `apply_chat_template` from a caller's `add_generation_prompt`,
        `continue_final_message` and extra template variables, which win over both (as
        upstream's `chat_template_kwargs` do); they may not set `messages`, `tokenize`,
        `chat_template` or `max_chars`, which are the call's own (`ValueError`). Continuing the
        final message and adding a generation prompt exclude each other (a `ValueError`, as
        HF's)."""
        if chat_template_kwargs is not None and not isinstance(chat_template_kwargs, dict):
            raise ValueError(
                f"chat_template_kwargs must be a dict, got {type(chat_template_kwargs).__name__}"
            )
        kwargs = dict(chat_template_kwargs or {})
        reserved = sorted(kwargs.keys() & {"messages", "tokenize", "chat_template", "max_chars"})
        if reserved:
            raise ValueError(f"chat_template_kwargs may not set {', '.join(reserved)}")
        kwargs.setdefault("add_generation_prompt", add_generation_prompt)
        kwargs.setdefault("continue_final_message", continue_final_message)
        if kwargs["continue_final_message"] and kwargs["add_generation_prompt"]:
            raise ValueError(CONTINUE_WITH_GENERATION_PROMPT)
        return kwargs

    def apply_chat_template(
        self,
        messages: list[dict],
        add_generation_prompt: bool = True,
        tokenize: bool = False,
        continue_final_message: bool = False,
        chat_template: str | None = None,
        max_chars: int | None = None,
        **kwargs: Any,
    ) -> str | list[int]:
        """Render `messages` with `chat_template` (default: the checkpoint's), as HF does; ids if
        `tokenize`. A rendering longer than `max_chars` characters (None: no limit) is a
        `RenderingTooLong` (a `ValueError`), raised as soon as the text grows past it.

        The template sees `messages` (an assistant message's `reasoning` also as
        `reasoning_content`, and the other way round), `add_generation_prompt`, the bos/eos/pad
        token texts, `tools` and `documents` (None unless given) and every extra keyword. Its text
        already holds the special tokens, so tokenizing adds none. With `continue_final_message`,
        the rendering ends where the final message's text does (whatever its role, as HF's), with
        none of what the template closes the message with, for the reply to continue it; its text
        stays as given (a template that trims it still leaves its trailing spaces, which HF would
        cut).
        """
        if chat_template is None:
            chat_template = self.chat_template
        if chat_template is None:
            raise ValueError("chat_template: this tokenizer has none; pass a prompt instead")
        check_messages(messages)
        messages = with_reasoning_aliases(messages)
        if continue_final_message and add_generation_prompt:
            raise ValueError(CONTINUE_WITH_GENERATION_PROMPT)
        stand_in = None
        if continue_final_message:
            messages, stand_in = mark_final_message(messages)
        template = compile_chat_template(chat_template)
        variables = {"bos_token": self.bos_token, "eos_token": self.eos_token}
        variables.update(pad_token=self.pad_token)
        # Defined when not given, as HF's: a template that tests `tools is not none` would take
        # an undefined for a list of tools.
        variables.update(tools=None, documents=None)
        variables.update(kwargs)  # may replace the special tokens' texts, as HF's
        variables.update(messages=messages, add_generation_prompt=add_generation_prompt)
        try:
            if max_chars is None:
                text = template.render(variables)
            else:
                text = render_within(template, variables, max_chars)
        except jinja2.TemplateError as e:  # includes the sandbox's SecurityError
            raise ValueError(f"chat_template failed on these messages: {e}") from e
        except (TypeError, ArithmeticError, LookupError, AttributeError, RecursionError) as e:
            # Python's own errors on the request's values, e.g. a `chat_template_kwargs`
            # eos_token that is an object added to a string, or a request's template whose
            # macro calls itself (500s in the server).
            raise ValueError(
                f"chat_template failed on these messages: {type(e).__name__}: {e}"
            ) from e
        if stand_in is not None:
            text = cut_at_stand_in(text, stand_in)
        return self.encode(text, add_special_tokens=False) if tokenize else text

    def tokenizer_info(self) -> dict[str, Any]:
        """tokenizer_config-like description for a /tokenizer_info endpoint."""
        info: dict[str, Any] = {
            "tokenizer_class": self._config.get("tokenizer_class", self.default_class),
            "bos_token": self.bos_token,
            "eos_token": self.eos_token,
            "pad_token": self.pad_token,
            "chat_template": self.chat_template,
        }
        limit = self._config.get("model_max_length")
        if not isinstance(limit, (int, float)) or limit >= _NO_LIMIT:
            limit = self._model_value("max_position_embeddings")
        if isinstance(limit, (int, float)) and limit < _NO_LIMIT:
            info["model_max_length"] = int(limit)
        return info

    def _known(self, ids: list[int]) -> list[int]:
        size = self.vocab_size
        return [i for i in ids if 0 <= i < size]

    def _model_value(self, key: str) -> Any:
        for cfg in self._model_configs:
            if cfg.get(key) is not None:
                return cfg[key]
        return None

    def _special_text(self, kind: str) -> str | None:
        text = _token_text(self._config.get(f"{kind}_token"))
        if text is not None:
            return text
        token_id = self._model_value(f"{kind}_token_id")
        if isinstance(token_id, list):  # several eos ids: the first names the token
            token_id = token_id[0] if token_id else None
        if isinstance(token_id, int) and 0 <= token_id < self.vocab_size:
            return self._id_to_token(token_id)
        return None

    def _find_chat_template(self, folder: Path) -> str | None:
        # The file first, as HF (and so upstream) reads it: a checkpoint that ships both (they
        # may differ) renders with the file there.
        file = folder / "chat_template.jinja"
        if file.is_file():
            return file.read_text(encoding="utf-8")
        template = self._config.get("chat_template")
        if isinstance(template, list):  # named templates: the one HF uses by default
            named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
            template = named.get("default")
        return template if isinstance(template, str) else None


class JsonTokenizer(Tokenizer):
    """A `tokenizer.json` read by the `tokenizers` library."""

    default_class = "PreTrainedTokenizerFast"

    def __init__(self, folder: Path) -> None:
        file = folder / "tokenizer.json"
        try:
            self._tok = tokenizers.Tokenizer.from_file(str(file))
        except Exception as e:  # the library raises a bare Exception, without the file's name
            raise ValueError(f"{file}: not a tokenizer the tokenizers library reads: {e}") from None
        added = self._tok.get_added_tokens_decoder()
        self._special_ids = sorted(i for i, tok in added.items() if tok.special)
        super().__init__(folder)

    def _encode(self, text: str, add_special_tokens: bool) -> list[int]:
        # A batch of one: unlike `encode`, the batch methods release the GIL while they run, so a
        # long text tokenized on a worker thread leaves the server's event loop running. The fast
        # variant computes no character offsets (unused here): twice as quick, and its result is
        # freed at once where `encode`'s took 0.3 s per 3.5 MB of text, holding the GIL.
        return self._tok.encode_batch_fast([text], add_special_tokens=add_special_tokens)[0].ids

    def _decode(self, ids: list[int], skip_special_tokens: bool) -> str:
        return self._tok.decode(ids, skip_special_tokens=skip_special_tokens)

    def _id_to_token(self, token_id: int) -> str:
        return self._tok.id_to_token(token_id) or ""

    def token_to_id(self, token: str) -> int | None:
        return self._tok.token_to_id(token)

    @property
    def vocab_size(self) -> int:
        return self._tok.get_vocab_size(with_added_tokens=True)

    @property
    def all_special_ids(self) -> list[int]:
        return list(self._special_ids)


def _read_tiktoken_ranks(path: Path) -> dict[bytes, int]:
    ranks: dict[bytes, int] = {}
    try:
        text = path.read_text(encoding="ascii")
    except (OSError, UnicodeDecodeError) as e:
        raise ValueError(f"{path}: cannot read it as ASCII text: {e}") from None
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            token, rank = line.split()
            ranks[base64.b64decode(token, validate=True)] = int(rank)
        except ValueError as e:  # binascii.Error is one
            raise ValueError(f"{path}:{number}: expected 'base64 rank', got {line!r}") from e
    if sorted(ranks.values()) != list(range(len(ranks))):
        raise ValueError(f"{path}: ranks must be 0..{len(ranks) - 1}, each once")
    return ranks


def _sorted_keys(value: Any) -> Any:
    """`value` (JSON-like) with the keys of each dict in it in sorted order."""
    if isinstance(value, dict):
        return {key: _sorted_keys(value[key]) for key in sorted(value)}
    if isinstance(value, list):
        return [_sorted_keys(item) for item in value]
    return value


class TiktokenTokenizer(Tokenizer):
    """Kimi's format: `tiktoken.model` ranks, special tokens from `tokenizer_config.json`.

    The special ids are the `NUM_RESERVED_SPECIAL_TOKENS` ids after the last rank; those that
    `added_tokens_decoder` does not name are `<|reserved_token_{id}|>`.
    """

    default_class = "TikTokenTokenizer"

    def __init__(self, folder: Path) -> None:
        ranks = _read_tiktoken_ranks(folder / "tiktoken.model")
        config = _read_json(folder / "tokenizer_config.json")
        first, end = len(ranks), len(ranks) + NUM_RESERVED_SPECIAL_TOKENS
        named: dict[int, str] = {}
        for key, entry in (config.get("added_tokens_decoder") or {}).items():
            token_id, text = int(key), _token_text(entry)
            if not first <= token_id < end or text is None:
                raise ValueError(
                    f"added_tokens_decoder: token {key} must have a 'content' and an id in "
                    f"[{first}, {end})"
                )
            named[token_id] = text
        self._special = {i: named.get(i, f"<|reserved_token_{i}|>") for i in range(first, end)}
        self._special_by_text = {text: i for i, text in self._special.items()}
        self._enc = tiktoken.Encoding(
            folder.name or "tiktoken",
            pat_str=KIMI_PAT_STR,
            mergeable_ranks=ranks,
            special_tokens=self._special_by_text,
        )
        self._special_pattern = re.compile(tiktoken_split.trie_pattern(list(self._special_by_text)))
        self._longest_special = max(map(len, self._special_by_text))
        super().__init__(folder)

    def apply_chat_template(
        self, messages: list[dict], *args: Any, **kwargs: Any
    ) -> str | list[int]:
        """As the base class, with the keys of every object in `tools` sorted at each depth
        first: Kimi's own tokenizer class does so before rendering, so a tool declared with its
        keys in any order gives the prompt the model was trained on."""
        if kwargs.get("tools") is not None:
            try:
                kwargs["tools"] = _sorted_keys(kwargs["tools"])
            except RecursionError as e:  # JSON the server parsed, nested past Python's stack
                raise ValueError("tools: nested too deeply to render") from e
        return super().apply_chat_template(messages, *args, **kwargs)

    def _encode(self, text: str, add_special_tokens: bool) -> list[int]:
        bos = self.bos_token_id
        add_bos = add_special_tokens and self._config.get("add_bos_token") and bos is not None
        ids: list[int] = [bos] if add_bos else []
        # Special tokens first, then the text between them in pieces, as Kimi's tokenizer runs
        # under HF (which splits on added tokens before its `_tokenize`): the cuts of the text
        # between two special tokens count from its own start, and no cut falls inside a special
        # token's text, which would turn the token into plain bytes (a chat turn's <|im_end|>
        # after a long run of non-whitespace).
        end = 0
        spans = tiktoken_split.special_spans(self._special_pattern, self._longest_special, text)
        for start, stop in spans:
            ids += self._encode_ordinary(text[end:start])
            ids.append(self._special_by_text[text[start:stop]])
            end = stop
        ids += self._encode_ordinary(text[end:])
        return ids

    def _encode_ordinary(self, text: str) -> list[int]:
        """Ids of text that holds no special token's text."""
        if len(text) <= tiktoken_split.MAX_RUN_CHARS:
            # Nothing to cut (a cut needs a run longer than this): one call, skipping the
            # search for long runs, whose cost per call was most of a chat's encode (one
            # text between two special tokens per message and role: 3x the time at 7k turns).
            return self._enc.encode_ordinary(text)
        ids: list[int] = []
        for piece in tiktoken_split.split_for_tiktoken(text):
            ids += self._enc.encode_ordinary(piece)
        return ids

    def _decode(self, ids: list[int], skip_special_tokens: bool) -> str:
        if skip_special_tokens:
            ids = [i for i in ids if i not in self._special]
        return self._enc.decode_bytes(ids).decode("utf-8", errors="replace")

    def token_bytes(self, token_id: int) -> bytes:
        if token_id in self._special or not 0 <= token_id < self.vocab_size:
            return super().token_bytes(token_id)
        return self._enc.decode_single_token_bytes(token_id)

    def _id_to_token(self, token_id: int) -> str:
        if token_id in self._special:
            return self._special[token_id]
        return "".join(_BYTE_TO_UNICODE[b] for b in self._enc.decode_single_token_bytes(token_id))

    def token_to_id(self, token: str) -> int | None:
        if token in self._special_by_text:
            return self._special_by_text[token]
        try:
            return self._enc.encode_single_token(bytes(_UNICODE_TO_BYTE[c] for c in token))
        except KeyError:
            return None

    @property
    def vocab_size(self) -> int:
        return self._enc.n_vocab

    @property
    def all_special_ids(self) -> list[int]:
        return list(self._special)


def has_tokenizer(folder: "str | Path") -> bool:
    """Whether `folder` holds a tokenizer that `get_tokenizer` reads."""
    path = Path(folder)
    return (path / "tokenizer.json").is_file() or (path / "tiktoken.model").is_file()


def get_tokenizer(folder: "str | Path") -> Tokenizer:
    """The tokenizer of checkpoint `folder`: its tokenizer.json, else its tiktoken.model. A file
    that cannot be read as a tokenizer is a CheckpointError naming it."""
    path = Path(folder)
    if not path.is_dir():
        raise ValueError(f"folder {str(folder)!r} is not a directory")
    if (path / "tokenizer.json").is_file():
        kind: type[Tokenizer] = JsonTokenizer
    elif (path / "tiktoken.model").is_file():
        kind = TiktokenTokenizer
    else:
        raise ValueError(f"folder {str(folder)!r} has neither tokenizer.json nor tiktoken.model")
    try:
        return kind(path)
    except ValueError as e:  # its files' content, each error naming its file
        raise CheckpointError(f"the tokenizer: {e}") from None
