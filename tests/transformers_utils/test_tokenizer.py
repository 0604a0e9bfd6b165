"""get_tokenizer on the built-in tiny tokenizer.json models and on a small Kimi-format tiktoken."""

import base64
import json
import random
import re
import shutil
import sys

import pytest
from gil_turns import gil_turns

from vllm.model_executor.model_loader.builtin import BUILTIN_MODELS
from vllm.model_executor.model_loader.errors import CheckpointError
from vllm.transformers_utils import tiktoken_split
from vllm.transformers_utils.chat_template import RenderingTooLong
from vllm.transformers_utils.tokenizer import get_tokenizer

TINY_SPECIAL = ("<|bos|>", "<|eos|>", "<|pad|>")
TEXTS = ["Question: 12 + 30 = ?", "héllo wörld\n\n  tabs\tand 世界 🙂 ok", "", " ", "a<b>&'c'"]

# Byte tokens 0..255, then merges; ids 261.. are special (256 of them).
MERGES = [b"he", b"ll", b"hell", b"hello", b"12", b"34", b"1234", b"a\xe4"]
BASE = 256 + len(MERGES)
KIMI_TEMPLATE = (
    "{%- if tools -%}<|im_system|>tools<|im_middle|>"
    "{{ tools | tojson(separators=(',', ':')) }}<|im_end|>{%- endif -%}"
    "{%- for message in messages -%}"
    "{%- if message['role'] not in ['user', 'assistant', 'system'] -%}"
    "{{ raise_exception('unknown role ' + message['role']) }}"
    "{%- endif -%}"
    "<|im_{{ message['role'] }}|>{{ message['role'] }}<|im_middle|>"
    "{{ message['content'] }}<|im_end|>"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}<|im_assistant|>assistant<|im_middle|>{%- endif -%}"
)
NAMED = {
    BASE: "[BOS]",
    BASE + 1: "[EOS]",
    BASE + 2: "<|im_end|>",
    BASE + 3: "<|im_user|>",
    BASE + 4: "<|im_assistant|>",
    BASE + 5: "<|im_system|>",
    BASE + 6: "<|im_middle|>",
    BASE + 255: "[PAD]",
}

NAMED_ID = {text: i for i, text in NAMED.items()}


def write_tiktoken_folder(folder, **config):
    folder.mkdir(exist_ok=True)
    tokens = [bytes([b]) for b in range(256)] + MERGES
    lines = [f"{base64.b64encode(t).decode()} {rank}" for rank, t in enumerate(tokens)]
    (folder / "tiktoken.model").write_text("\n".join(lines) + "\n")
    cfg = {
        "added_tokens_decoder": {str(i): {"content": t, "special": True} for i, t in NAMED.items()},
        "bos_token": "[BOS]",
        "eos_token": {"content": "[EOS]", "special": True},
        "pad_token": "[PAD]",
        "tokenizer_class": "TikTokenTokenizer",
        "model_max_length": 1048576,
        "chat_template": KIMI_TEMPLATE,
        **config,
    }
    (folder / "tokenizer_config.json").write_text(json.dumps(cfg))
    return folder


@pytest.fixture
def kimi(tmp_path):
    return get_tokenizer(write_tiktoken_folder(tmp_path / "kimi"))


@pytest.mark.parametrize("name", sorted(BUILTIN_MODELS))
def test_builtin_tiny_tokenizer(name):
    tok = get_tokenizer(BUILTIN_MODELS[name])
    assert (tok.bos_token_id, tok.eos_token_id, tok.pad_token_id) == (256, 257, 258)
    assert (tok.bos_token, tok.eos_token) == ("<|bos|>", "<|eos|>")
    assert tok.vocab_size == 259 and tok.all_special_ids == [256, 257, 258]
    for text in TEXTS:
        ids = tok.encode(text)
        assert all(0 <= i < 256 for i in ids)
        assert tok.decode(ids) == text
    ids = tok.encode("<|bos|>hi<|eos|>")
    assert ids[0] == 256 and ids[-1] == 257 and len(ids) == 4
    assert tok.decode(ids) == "hi"
    assert tok.decode(ids, skip_special_tokens=False) == "<|bos|>hi<|eos|>"
    # Ids past the tokenizer (the tiny models' embeddings have 320 rows) decode to nothing.
    assert tok.decode([*ids, 300, 319], skip_special_tokens=False) == "<|bos|>hi<|eos|>"
    assert tok.convert_ids_to_tokens([256, *tok.encode(" é"), 300]) == [
        "<|bos|>",
        "Ġ",
        "Ã",
        "©",
        "",
    ]


@pytest.mark.parametrize("name", sorted(BUILTIN_MODELS))
def test_builtin_tiny_chat_template(name):
    tok = get_tokenizer(BUILTIN_MODELS[name])
    messages = [
        {"role": "system", "content": "be brief"},
        {
            "role": "user",
            "content": [{"type": "text", "text": "hi "}, {"type": "text", "text": "世"}],
        },
    ]
    text = tok.apply_chat_template(messages)
    assert text == "<|bos|>system: be brief<|eos|>\nuser: hi 世<|eos|>\nassistant: "
    closed = tok.apply_chat_template(messages, add_generation_prompt=False)
    assert closed == text.removesuffix("assistant: ")
    ids = tok.apply_chat_template(messages, tokenize=True)
    assert ids == tok.encode(text, add_special_tokens=False)
    assert ids[0] == 256 and ids.count(257) == 2
    info = tok.tokenizer_info()
    assert info["tokenizer_class"] == "PreTrainedTokenizerFast"
    assert info["model_max_length"] == 4096 and info["chat_template"] == tok.chat_template
    assert (info["bos_token"], info["eos_token"], info["pad_token"]) == TINY_SPECIAL


@pytest.mark.parametrize(
    "content, end",
    [
        ("The answer is", "assistant: The answer is"),
        # Text that the template's own markup also holds: HF's search for it in the rendering
        # would cut inside the closing "<|eos|>".
        ("eos", "assistant: eos"),
        ("", "assistant: "),  # HF's search finds an empty text at the end: the turn stays closed
        ([{"type": "text", "text": "It is "}, {"type": "text", "text": "4"}], "assistant: It is 4"),
    ],
)
def test_continue_final_message_leaves_it_open(content, end):
    """The rendering ends with the final message's text, without what closes its turn."""
    tok = get_tokenizer(BUILTIN_MODELS["kimi-k3-tiny"])
    messages = [{"role": "user", "content": "2 + 2?"}, {"role": "assistant", "content": content}]
    text = tok.apply_chat_template(
        messages, add_generation_prompt=False, continue_final_message=True
    )
    assert text == "<|bos|>user: 2 + 2?<|eos|>\n" + end
    closed = tok.apply_chat_template(messages, add_generation_prompt=False)
    assert closed == text + "<|eos|>\n"
    ids = tok.apply_chat_template(
        messages, add_generation_prompt=False, continue_final_message=True, tokenize=True
    )
    assert ids == tok.encode(text, add_special_tokens=False) and ids[-1] != tok.eos_token_id
    assert messages[1]["content"] == content  # the caller's messages are left as they were


@pytest.mark.parametrize("role", ["user", "system"])
def test_continue_final_message_of_any_role(role):
    """As HF and upstream vLLM: a final message of another role than the assistant's is left
    open too (a user's text, for the reply to complete in the user's turn)."""
    tok = get_tokenizer(BUILTIN_MODELS["kimi-k3-tiny"])
    messages = [{"role": "user", "content": "hi"}, {"role": role, "content": "Complete th"}]
    text = tok.apply_chat_template(
        messages, add_generation_prompt=False, continue_final_message=True
    )
    assert text == f"<|bos|>user: hi<|eos|>\n{role}: Complete th"
    closed = tok.apply_chat_template(messages, add_generation_prompt=False)
    assert closed == text + "<|eos|>\n"


def test_continue_final_message_with_kimis_markup(kimi):
    messages = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "end"}]
    text = kimi.apply_chat_template(
        messages, add_generation_prompt=False, continue_final_message=True
    )
    # "end" is also in "<|im_end|>", which the closed rendering puts after it.
    assert text == (
        "<|im_user|>user<|im_middle|>hi<|im_end|><|im_assistant|>assistant<|im_middle|>end"
    )


def test_continue_final_message_is_refused_where_it_is_not_well_defined(tmp_path):
    tok = get_tokenizer(BUILTIN_MODELS["kimi-k3-tiny"])
    user = [{"role": "user", "content": "hi"}]
    answer = [*user, {"role": "assistant", "content": "It is"}]
    # The generation prompt would open a new turn after the message (HF refuses this too).
    with pytest.raises(ValueError, match="cannot both be true"):
        tok.apply_chat_template(answer, continue_final_message=True)
    with pytest.raises(ValueError, match="continues the final message: there is none"):
        tok.apply_chat_template([], add_generation_prompt=False, continue_final_message=True)
    # A template that leaves the message's text out gives no place to continue from.
    with pytest.raises(ValueError, match="does not render the final message's text"):
        tok.apply_chat_template(
            answer,
            add_generation_prompt=False,
            continue_final_message=True,
            chat_template="{% for m in messages %}{{ m['role'] }}{% endfor %}",
        )


def test_chat_template_arguments():
    tok = get_tokenizer(BUILTIN_MODELS["kimi-k3-tiny"])
    assert tok.chat_template_arguments(True, None) == {
        "add_generation_prompt": True,
        "continue_final_message": False,
    }
    # chat_template_kwargs win over the caller's own fields, continue_final_message included.
    assert tok.chat_template_arguments(True, {"add_generation_prompt": False}, True) == {
        "add_generation_prompt": False,
        "continue_final_message": True,
    }
    assert tok.chat_template_arguments(False, {"continue_final_message": True}) == {
        "add_generation_prompt": False,
        "continue_final_message": True,
    }
    with pytest.raises(ValueError, match="cannot both be true"):
        tok.chat_template_arguments(True, None, True)
    with pytest.raises(ValueError, match="cannot both be true"):
        tok.chat_template_arguments(True, {"continue_final_message": True})
    # The template itself is the call's own argument, as are the messages and the length limit.
    with pytest.raises(ValueError, match="may not set chat_template, max_chars, messages"):
        tok.chat_template_arguments(True, {"chat_template": "x", "messages": [], "max_chars": 9})


def test_a_rendering_past_max_chars_stops_there():
    """An eos_token replaced through the kwargs is written after every message: 64 kB of it after
    each of 2,000 messages was 128 MB of prompt from a 64 kB request, all held before any length
    check. With `max_chars` the rendering stops as it grows past the limit; within it, the text
    is the one rendered without a limit."""
    tok = get_tokenizer(BUILTIN_MODELS["kimi-k3-tiny"])
    messages = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]
    text = tok.apply_chat_template(messages)
    assert tok.apply_chat_template(messages, max_chars=len(text)) == text
    with pytest.raises(RenderingTooLong):
        tok.apply_chat_template(messages, max_chars=len(text) - 1)
    continued = {"add_generation_prompt": False, "continue_final_message": True}
    text = tok.apply_chat_template(messages, **continued)
    assert tok.apply_chat_template(messages, max_chars=1000, **continued) == text
    eos = "x" * 64_000
    with pytest.raises(RenderingTooLong, match="to more than 1000000 characters"):
        tok.apply_chat_template(messages * 1000, max_chars=1_000_000, eos_token=eos)
    assert issubclass(RenderingTooLong, ValueError)  # a bad request, as the template's errors


def test_a_callers_chat_template_replaces_the_checkpoints():
    tok = get_tokenizer(BUILTIN_MODELS["kimi-k3-tiny"])
    messages = [{"role": "user", "content": "hi"}]
    own = "{{ greeting }}{% for m in messages %}[{{ m['content'] }}]{% endfor %}"
    assert tok.apply_chat_template(messages, chat_template=own, greeting="hey ") == "hey [hi]"
    assert tok.apply_chat_template(messages).startswith("<|bos|>user: hi")  # left as it was
    with pytest.raises(ValueError, match="chat_template does not parse"):
        tok.apply_chat_template(messages, chat_template="{% if %}")
    # The same sandbox as the checkpoint's template.
    with pytest.raises(ValueError, match="chat_template failed"):
        tok.apply_chat_template(messages, chat_template="{{ messages.pop() }}")
    assert messages == [{"role": "user", "content": "hi"}]


def test_chat_template_sees_no_tools_and_no_documents_as_none():
    """HF renders with `tools` and `documents` always defined, None when not given: a template
    that tests `tools is not none` (Mistral v0.3's does) took an undefined for a list of tools and
    failed on `tojson`, so every chat without tools was a 400."""
    tok = get_tokenizer(BUILTIN_MODELS["kimi-k3-tiny"])
    messages = [{"role": "user", "content": "hi"}]
    own = (
        "{% if tools is not none %}tools: {{ tools | tojson }}\n{% endif %}"
        "{% if documents is none %}no documents{% endif %}"
    )
    assert tok.apply_chat_template(messages, chat_template=own) == "no documents"
    assert tok.apply_chat_template(messages, chat_template=own, tools=[{"name": "f"}]) == (
        'tools: [{"name": "f"}]\nno documents'
    )
    assert (
        tok.apply_chat_template(
            messages, chat_template="{{ documents | length }}", documents=[{"text": "d"}]
        )
        == "1"
    )


def test_chat_template_renders_generation_blocks():
    """HF's `{% generation %}` marks the assistant's tokens for its training masks; its body
    renders as if unmarked. Templates that hold one did not parse."""
    tok = get_tokenizer(BUILTIN_MODELS["kimi-k3-tiny"])
    messages = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]
    own = (
        "{% for m in messages %}{{ m['role'] }}: {% if m['role'] == 'assistant' %}"
        "{% generation %}{{ m['content'] }}{{ eos_token }}{% endgeneration %}"
        "{% else %}{{ m['content'] }}{{ eos_token }}{% endif %}{% endfor %}"
    )
    assert (
        tok.apply_chat_template(messages, chat_template=own)
        == "user: hi<|eos|>assistant: yo<|eos|>"
    )
    # Its body has a scope of its own, as in HF: a `set` there is not seen after it.
    scoped = "{% set x = 1 %}{% generation %}{% set x = 2 %}{{ x }}{% endgeneration %}{{ x }}"
    assert tok.apply_chat_template(messages, chat_template=scoped) == "21"
    with pytest.raises(ValueError, match="does not parse"):
        tok.apply_chat_template(messages, chat_template="{% generation %}unclosed")


@pytest.mark.parametrize(
    "nested",
    [
        "{% for m in messages %}" * 30 + "x" + "{% endfor %}" * 30,  # Python's 20 nested blocks
        "{% if true %}" * 200 + "x" + "{% endif %}" * 200,  # its 100 levels of indentation
        "{{ " + "(" * 3000 + "1" + ")" * 3000 + " }}",  # the parser's recursion
    ],
)
def test_a_chat_template_nested_past_pythons_limits_does_not_parse(nested):
    """Jinja compiles a template to Python: one nested past what Python compiles raised its
    SyntaxError or RecursionError (a 500 for a request's own template) where a template that
    does not parse is a ValueError."""
    tok = get_tokenizer(BUILTIN_MODELS["kimi-k3-tiny"])
    with pytest.raises(ValueError, match="chat_template does not parse: nested too deeply"):
        tok.apply_chat_template([{"role": "user", "content": "hi"}], chat_template=nested)


@pytest.mark.parametrize(
    "part, shown",
    [
        ({"type": "image_url", "image_url": {"url": "http://x/y.png"}}, "type 'image_url'"),
        ({"type": "input_audio", "input_audio": {"data": "", "format": "wav"}},
         "type 'input_audio'"),
        ({"text": "no type"}, "no type"),
        ({"type": "text", "text": 5}, "type 'text'"),
        ("a bare string", "no type"),
    ],
)  # fmt: skip
def test_chat_template_refuses_parts_other_than_text(part, shown):
    """The tiny templates (like many) render text parts and skip the rest: an image-only message
    rendered as an empty one and was answered as such, with no error."""
    tok = get_tokenizer(BUILTIN_MODELS["kimi-k3-tiny"])
    messages = [{"role": "user", "content": [{"type": "text", "text": "what is this?"}, part]}]
    with pytest.raises(ValueError, match=rf"messages\[0\]\.content\[1\]: .*{shown}"):
        tok.apply_chat_template(messages)


@pytest.mark.parametrize("content", [1, {"text": "hi"}, 2.5])
def test_chat_template_refuses_content_of_another_type(content):
    # The templates rendered such a content as nothing: the reply answered an empty turn.
    tok = get_tokenizer(BUILTIN_MODELS["kimi-k3-tiny"])
    with pytest.raises(ValueError, match=r"messages\[1\]\.content must be a string or a list"):
        tok.apply_chat_template(
            [{"role": "user", "content": "a"}, {"role": "user", "content": content}]
        )
    # None (a turn of tool calls) and a missing content stay the template's to render.
    for message in ({"role": "assistant", "content": None}, {"role": "assistant"}):
        tok.apply_chat_template([{"role": "user", "content": "a"}, message])


@pytest.mark.parametrize("name", sorted(BUILTIN_MODELS))
def test_tokenizer_json_without_tokenizer_config_reads_config_ids(tmp_path, name):
    for file in ("tokenizer.json", "config.json"):
        shutil.copy(BUILTIN_MODELS[name] / file, tmp_path / file)
    tok = get_tokenizer(tmp_path)
    # kimi-k3-tiny keeps pad_token_id only in text_config.
    assert (tok.bos_token, tok.eos_token, tok.pad_token) == TINY_SPECIAL
    assert tok.pad_token_id == 258
    assert tok.chat_template is None
    with pytest.raises(ValueError, match="chat_template"):
        tok.apply_chat_template([{"role": "user", "content": "hi"}])
    info = tok.tokenizer_info()
    assert info["model_max_length"] == 4096 and info["chat_template"] is None


@pytest.mark.parametrize("kind", ["json", "tiktoken"])
def test_chat_template_jinja_wins_over_tokenizer_config(tmp_path, kind):
    """HF (and so upstream) reads a folder's chat_template.jinja before the template in
    tokenizer_config.json: where a checkpoint ships both, the file is the one it renders."""
    if kind == "json":
        folder = tmp_path / "tiny"
        shutil.copytree(BUILTIN_MODELS["kimi-k3-tiny"], folder)
    else:
        folder = write_tiktoken_folder(tmp_path / "kimi")
    messages = [{"role": "user", "content": "hi"}]
    config_template = get_tokenizer(folder).chat_template
    assert config_template is not None
    own = "file:{% for m in messages %}{{ m['content'] }}{% endfor %}"
    (folder / "chat_template.jinja").write_text(own)
    tok = get_tokenizer(folder)
    assert tok.chat_template == own and tok.tokenizer_info()["chat_template"] == own
    assert tok.apply_chat_template(messages) == "file:hi"


def test_tiktoken_merges_and_kimi_split(kimi):
    rank = {t: 256 + i for i, t in enumerate(MERGES)}
    assert kimi.encode("hello") == [rank[b"hello"]]
    assert kimi.encode("hello hello") == [rank[b"hello"], 32, rank[b"hello"]]
    assert kimi.encode("1234") == [rank[b"12"], ord("3"), ord("4")]  # digits split by three
    assert kimi.encode("x1234") == [ord("x"), rank[b"12"], ord("3"), ord("4")]
    # Han is cut from letters of other scripts, so the merge "a\xe4" never applies.
    assert kimi.encode("a世") == [ord("a"), *"世".encode()]
    assert kimi.convert_ids_to_tokens([rank[b"hello"], 32, 0xE4]) == ["hello", "Ġ", "ä"]
    assert kimi.token_to_id("hello") == rank[b"hello"] and kimi.token_to_id("Ġ") == 32
    assert kimi.token_to_id("no such token") is None


def test_tiktoken_round_trips(kimi):
    rng = random.Random(0)
    alphabet = "hel o12345 \n\t世界🙂éÅ.,!'sABC"
    texts = TEXTS + [
        "".join(rng.choice(alphabet) for _ in range(rng.randint(1, 60))) for _ in range(200)
    ]
    for text in texts:
        ids = kimi.encode(text)
        assert all(0 <= i < BASE for i in ids)
        assert kimi.decode(ids) == text


def test_tiktoken_special_tokens(kimi):
    assert (kimi.bos_token_id, kimi.eos_token_id, kimi.pad_token_id) == (BASE, BASE + 1, BASE + 255)
    assert (kimi.bos_token, kimi.eos_token, kimi.pad_token) == ("[BOS]", "[EOS]", "[PAD]")
    assert kimi.vocab_size == BASE + 256
    assert kimi.all_special_ids == list(range(BASE, BASE + 256))
    assert kimi.convert_ids_to_tokens([BASE + 7, BASE + 2]) == [
        f"<|reserved_token_{BASE + 7}|>",
        "<|im_end|>",
    ]
    # Special-token text in the input is read as the special token, as Kimi's tokenizer does.
    ids = kimi.encode("[BOS]hello<|im_end|>" + f"<|reserved_token_{BASE + 7}|>")
    assert ids == [BASE, 256 + MERGES.index(b"hello"), BASE + 2, BASE + 7]
    assert kimi.decode(ids) == "hello"
    assert kimi.decode(ids, skip_special_tokens=False) == (
        f"[BOS]hello<|im_end|><|reserved_token_{BASE + 7}|>"
    )
    # Ids outside the vocabulary decode to nothing.
    assert kimi.decode([*ids, BASE + 256, -1], skip_special_tokens=False).endswith(f"{BASE + 7}|>")
    assert kimi.decode([0xE4, 0xB8]) == "\ufffd"  # an incomplete character


def test_tiktoken_add_bos_token(tmp_path):
    tok = get_tokenizer(write_tiktoken_folder(tmp_path / "k", add_bos_token=True))
    assert tok.encode("hi") == [BASE, ord("h"), ord("i")]
    assert tok.encode("hi", add_special_tokens=False) == [ord("h"), ord("i")]


def test_tiktoken_chat_template(kimi):
    messages = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "ok <b>"}]
    # Kimi's tokenizer sorts the tools' keys at every depth before rendering.
    tools = [
        {
            "name": "f",
            "parameters": {"type": "object", "properties": {}},
            "description": "<x> & 'y'",
        }
    ]
    text = kimi.apply_chat_template(messages, tools=tools)
    assert text == (
        '<|im_system|>tools<|im_middle|>[{"description":"<x> & \'y\'","name":"f",'
        '"parameters":{"properties":{},"type":"object"}}]<|im_end|>'
        "<|im_user|>user<|im_middle|>hi<|im_end|>"
        "<|im_assistant|>assistant<|im_middle|>ok <b><|im_end|>"
        "<|im_assistant|>assistant<|im_middle|>"
    )
    ids = kimi.apply_chat_template(messages[:1], tokenize=True)
    assert ids == [
        BASE + 3,
        *b"user",
        BASE + 6,
        *b"hi",
        BASE + 2,
        BASE + 4,
        *b"assistant",
        BASE + 6,
    ]
    deep: list = []
    for _ in range(sys.getrecursionlimit()):
        deep = [deep]  # JSON that json.loads accepts nests this deep
    with pytest.raises(ValueError, match="tools: nested too deeply"):
        kimi.apply_chat_template(messages, tools=[{"name": "f", "parameters": deep}])
    with pytest.raises(ValueError, match="unknown role tool"):
        kimi.apply_chat_template([{"role": "tool", "content": "x"}])
    with pytest.raises(ValueError, match="messages"):
        kimi.apply_chat_template([{"content": "no role"}])
    info = kimi.tokenizer_info()
    assert info == {
        "tokenizer_class": "TikTokenTokenizer",
        "bos_token": "[BOS]",
        "eos_token": "[EOS]",
        "pad_token": "[PAD]",
        "chat_template": KIMI_TEMPLATE,
        "model_max_length": 1048576,
    }


def test_chat_template_is_sandboxed_and_checked(tmp_path):
    messages = [{"role": "user", "content": "hi"}]
    tok = get_tokenizer(write_tiktoken_folder(tmp_path / "a", chat_template="{{ messages.pop() }}"))
    with pytest.raises(ValueError, match="chat_template failed"):
        tok.apply_chat_template(messages)
    assert messages == [{"role": "user", "content": "hi"}]
    tok = get_tokenizer(write_tiktoken_folder(tmp_path / "b", chat_template="{% if %}"))
    with pytest.raises(ValueError, match="chat_template does not parse"):
        tok.apply_chat_template(messages)
    tok = get_tokenizer(write_tiktoken_folder(tmp_path / "c", chat_template="{{ bos_token }}!"))
    assert tok.apply_chat_template(messages, bos_token="override") == "override!"


def test_tiktoken_long_runs_are_encoded_in_pieces(kimi, monkeypatch):
    monkeypatch.setattr(tiktoken_split, "MAX_RUN_CHARS", 5)
    monkeypatch.setattr(tiktoken_split, "MAX_ENCODE_CHARS", 16)
    text = "hellohellohello" + " " * 12 + "12" * 9 + "\n"
    pieces = tiktoken_split.split_for_tiktoken(text)
    # Runs cut every 5 characters, the text every 16.
    assert pieces == [
        "hello", "hello", "hello ", "     ", "     ", " 12121", "21212", "12121", "212\n"
    ]  # fmt: skip
    assert kimi.decode(kimi.encode(text)) == text
    assert kimi.encode("hellohello") == [256 + MERGES.index(b"hello")] * 2


def _split_in_one_pass(text):
    """The split as it was made before `_long_runs`: per chunk of `MAX_ENCODE_CHARS`, one regex
    pass finds the long runs (the lookbehinds anchor each match at a run's start in the chunk).
    The reference for the cuts, which decide the token ids."""
    max_run, max_encode = tiktoken_split.MAX_RUN_CHARS, tiktoken_split.MAX_ENCODE_CHARS
    pieces = []
    for at in range(0, len(text), max_encode):
        chunk = text[at : at + max_encode]
        cuts = set()
        for run in re.finditer(rf"(?<!\s)\s{{{max_run},}}|(?<!\S)\S{{{max_run},}}", chunk):
            cuts.update(range(run.start() + max_run, run.end(), max_run))
        bounds = [0, *sorted(cuts), len(chunk)]
        pieces += [chunk[a:b] for a, b in zip(bounds, bounds[1:], strict=False)]
    return pieces


def _split_as_kimi(text, max_run, max_encode):
    """Kimi's tokenization_kimi.py, restated character by character: the text in chunks of
    `max_encode`, and in each chunk on its own, a piece ends before the character that would
    make its current run of whitespace or of non-whitespace longer than `max_run`."""
    pieces = []
    for at in range(0, len(text), max_encode):
        chunk = text[at : at + max_encode]
        piece_start, run, space = 0, 0, chunk[0].isspace()
        for i, char in enumerate(chunk):
            run = run + 1 if char.isspace() == space else 1
            space = char.isspace()
            if run > max_run:
                pieces.append(chunk[piece_start:i])
                piece_start, run = i, 1
        pieces.append(chunk[piece_start:])
    return pieces


@pytest.mark.parametrize("max_run, max_encode", [(1, 3), (2, 7), (5, 16), (7, 1000)])
def test_tiktoken_split_restarts_runs_in_each_chunk_as_kimi(monkeypatch, max_run, max_encode):
    """A run across a chunk's end is counted afresh in the next chunk, as in Kimi's encode."""
    monkeypatch.setattr(tiktoken_split, "MAX_RUN_CHARS", max_run)
    monkeypatch.setattr(tiktoken_split, "MAX_ENCODE_CHARS", max_encode)
    rng = random.Random(max_encode)
    for _ in range(300):
        text = "".join(rng.choice(RUNS) * rng.randint(1, 3 * max_run) for _ in range(12))
        expected = _split_as_kimi(text, max_run, max_encode)
        assert tiktoken_split.split_for_tiktoken(text) == expected, repr(text)


def test_tiktoken_run_across_a_400k_cut_encodes_as_kimi(kimi):
    """Real limits: a 30k run from 10 characters before the 400k cut. Counted from its start in
    the text, it was also cut 25k in, mid-"hello": one more token than Kimi's ids."""
    text = "x" * 390_000 + " y" + "hello" * 6_000 + " end"
    expected = _split_as_kimi(text, 25_000, 400_000)
    assert tiktoken_split.split_for_tiktoken(text) == expected
    assert kimi.encode(text) == [
        i for piece in expected for i in kimi._enc.encode(piece, allowed_special="all")
    ]


def _encode_as_hf(kimi, text):
    """Kimi's ids as HF runs its tokenizer: special tokens split off first (one regex pass),
    the text between them split on its own."""
    specials = sorted(kimi._special_by_text, key=len, reverse=True)
    segments = re.split(f"({'|'.join(map(re.escape, specials))})", text)
    ids = []
    for k, segment in enumerate(segments):
        if k % 2:
            ids.append(kimi._special_by_text[segment])
        else:
            ids += [i for piece in _split_in_one_pass(segment) for i in kimi._enc.encode(piece)]
    return ids


def _assert_split_as_in_one_pass(kimi, text):
    pieces = tiktoken_split.split_for_tiktoken(text)
    assert pieces == _split_in_one_pass(text), repr(text[:80])
    assert kimi.encode(text) == _encode_as_hf(kimi, text)


# Runs that the split cuts or leaves whole: whitespace of several kinds (Unicode's too), digits,
# letters, CJK, emoji, and special-token text, which is non-whitespace.
RUNS = [" ", "\n", "\r\n", "\t", "\u3000", "\xa0", "\u2028", "\x1c", "7", "a", "世", "🙂", "é",
        ".", "[BOS]", "<|im_end|>", "[EOS]"]  # fmt: skip


@pytest.mark.parametrize(
    "max_run, max_encode, scan", [(1, 3, 1), (2, 7, 3), (5, 16, 4), (7, 1000, 2), (13, 40, 100)]
)
def test_tiktoken_split_cuts_as_one_regex_pass(kimi, monkeypatch, max_run, max_encode, scan):
    """Runs found position by position, and followed `scan` characters at a time, are cut where
    the one-pass regex cut them: the same pieces, so the same ids. Small limits make the cuts
    many, and put them everywhere: at a run's first and last characters, on the text's ends, in
    special tokens."""
    monkeypatch.setattr(tiktoken_split, "MAX_RUN_CHARS", max_run)
    monkeypatch.setattr(tiktoken_split, "MAX_ENCODE_CHARS", max_encode)
    monkeypatch.setattr(tiktoken_split, "SCAN_CHARS", scan)
    rng = random.Random(max_run)
    texts = ["", " ", "a", " " * 40, "9" * 41, "\n" * 39 + "x", "x" + "\t" * 39, "[BOS]" * 9]
    lengths = [1, 2, max_run - 1, max_run, max_run + 1, 3 * max_run]
    for _ in range(300):
        runs = [rng.choice(RUNS) * rng.choice(lengths) for _ in range(rng.randint(1, 12))]
        texts.append("".join(runs))
    for text in texts:
        _assert_split_as_in_one_pass(kimi, text)


def test_tiktoken_split_of_long_texts_as_one_regex_pass(kimi):
    """The real limits, on texts of runs around them, crossing the 400k cuts."""
    max_run = tiktoken_split.MAX_RUN_CHARS
    rng = random.Random(0)
    for kind in RUNS:
        runs = [kind * n for n in (max_run - 1, max_run, max_run + 1, 2 * max_run, 170_001)]
        rng.shuffle(runs)
        _assert_split_as_in_one_pass(kimi, " hello 12".join(runs) + "\n")
    text = "".join(rng.choice(RUNS) * rng.randint(1, 3 * max_run) for _ in range(150))
    _assert_split_as_in_one_pass(kimi, text)


@pytest.mark.parametrize("length", [24_970, 24_950, 49_968, 49_955])
def test_tiktoken_long_run_keeps_the_special_tokens_around_it(kimi, length):
    """A message of one long run of non-whitespace: the run goes on through the template's
    special tokens, and was cut every 25k characters from its start, inside <|im_end|> here,
    which then encoded as the bytes of its text. Split off first, each stays one token."""
    messages = [{"role": "user", "content": "A" * length}]
    ids = kimi.apply_chat_template(messages, tokenize=True)
    specials = [i for i in ids if kimi.is_special(i)]
    names = ["<|im_user|>", "<|im_middle|>", "<|im_end|>", "<|im_assistant|>", "<|im_middle|>"]
    assert specials == [NAMED_ID[name] for name in names]
    assert ids == _encode_as_hf(kimi, kimi.apply_chat_template(messages))


def test_tiktoken_special_token_across_the_400k_cut(kimi):
    """A special token whose text spans character 400k stays one token; the text after it is
    cut 400k characters from the token's end, not from the text's start."""
    text = "ab " * 133_332 + "<|im_end|>" + "cd " * 133_334
    assert text.index("<|im_end|>") < 400_000 < text.index("<|im_end|>") + 10
    ids = kimi.encode(text)
    assert ids.count(NAMED_ID["<|im_end|>"]) == 1
    assert ids == _encode_as_hf(kimi, text)
    assert kimi.decode(ids, skip_special_tokens=False) == text


@pytest.mark.parametrize("scan", [1, 2, 5, 9, 64])
def test_tiktoken_special_tokens_across_scan_windows(kimi, monkeypatch, scan):
    """Special tokens are looked for `SCAN_CHARS` characters at a time: one that starts in a
    window and ends past it, or ends where the next begins, is still found whole."""
    monkeypatch.setattr(tiktoken_split, "SCAN_CHARS", scan)
    rng = random.Random(scan)
    parts = [*NAMED.values(), "<|im_", "|>", "[EO", "x", "hello ", "<", "|"]
    for _ in range(300):
        text = "".join(rng.choice(parts) for _ in range(rng.randint(0, 12)))
        assert kimi.encode(text) == _encode_as_hf(kimi, text), repr(text)


def test_tiktoken_short_texts_between_special_tokens_skip_the_split(kimi, monkeypatch):
    """A chat's text between two special tokens (a role, a short message) is too short to hold
    a run to cut: it is encoded in one call, without looking for long runs, which cost a
    1M-character chat of 7k turns 3x the time of encoding it."""

    def no_split(text):
        raise AssertionError(f"split searched for long runs in {len(text)} characters")

    monkeypatch.setattr(tiktoken_split, "split_for_tiktoken", no_split)
    turn = "<|im_user|>user<|im_middle|>" + "hello world " * 8 + "<|im_end|>"
    text = turn * 100 + "x" * tiktoken_split.MAX_RUN_CHARS
    monkeypatch.undo()
    expected = _encode_as_hf(kimi, text)
    monkeypatch.setattr(tiktoken_split, "split_for_tiktoken", no_split)
    assert kimi.encode(text) == expected


@pytest.mark.parametrize("extra", [0, 1, 2])
def test_tiktoken_run_at_the_cut_length_between_special_tokens(kimi, extra):
    """A run of `MAX_RUN_CHARS` characters stays whole, one character more is cut (between
    "hell" and "o" here, which changes the ids), also between two special tokens."""
    limit = tiktoken_split.MAX_RUN_CHARS
    text = "<|im_end|>" + ("x" + "hello" * limit)[: limit + extra] + "<|im_end|>"
    ids = kimi.encode(text)
    assert ids == _encode_as_hf(kimi, text)
    if extra == 1:  # the run's last "hello" cut after its "hell"
        assert ids[-3:] == [256 + MERGES.index(b"hell"), ord("o"), NAMED_ID["<|im_end|>"]]


@pytest.mark.parametrize("scan", [1, 2, 3, 4, 5])
def test_tiktoken_special_token_past_its_scan_window_is_not_scanned_again(
    tmp_path, monkeypatch, scan
):
    """A special token that starts in one window and ends in the next is taken whole, and the
    next window starts after it: a special token that is the end of another ("y|>" of "<|xy|>")
    is not found again inside it."""
    monkeypatch.setattr(tiktoken_split, "SCAN_CHARS", scan)
    names = {**NAMED, BASE + 7: "<|xy|>", BASE + 8: "y|>"}
    decoder = {str(i): {"content": t, "special": True} for i, t in names.items()}
    kimi = get_tokenizer(write_tiktoken_folder(tmp_path / "k", added_tokens_decoder=decoder))
    assert kimi.encode("<|xy|>") == [BASE + 7]
    assert kimi.encode("a<|xy|>y|>") == [ord("a"), BASE + 7, BASE + 8]


def test_tiktoken_longest_special_token_wins(tmp_path):
    """Where one special token's text starts another's, the longer one is taken (as HF's
    trie): "<|a|>x" is one token, not "<|a|>" then "x"; "<|a" alone is the short one."""
    names = {**NAMED, BASE + 7: "<|a", BASE + 8: "<|a|>", BASE + 9: "<|a|>x"}
    decoder = {str(i): {"content": t, "special": True} for i, t in names.items()}
    kimi = get_tokenizer(write_tiktoken_folder(tmp_path / "k", added_tokens_decoder=decoder))
    assert kimi.encode("<|a|>x") == [BASE + 9]
    assert kimi.encode("<|a|>y") == [BASE + 8, ord("y")]
    assert kimi.encode("<|a|") == [BASE + 7, ord("|")]


def test_tiktoken_split_lets_other_threads_run(monkeypatch):
    """While the runs of 23 MB of prose are looked for, a thread waiting for the GIL (the server's
    event loop, while a worker thread tokenizes a prompt) takes it many times; one regex pass
    over the text held it throughout (1 turn, 1.4 s here). Counted in the thread's turns, not in
    time: waiting, it asks for the GIL after the switch interval (1 us here) and gets it at the
    next point between two bytecodes, of which that pass had none. A run limit of 100 makes
    positions to measure, so chances for a turn, in the hundreds of thousands (1900 to 2600
    turns seen on an idle machine of two cores, 1500 to 6400 with two busy processes on it); no
    400k cuts, so that the turns counted are all the search's."""
    monkeypatch.setattr(tiktoken_split, "MAX_ENCODE_CHARS", 10**9)
    monkeypatch.setattr(tiktoken_split, "MAX_RUN_CHARS", 100)
    unit = "The quick brown fox, 12345 jumps!\n\nhello  world\t世界 é "
    text = unit * (23_000_000 // len(unit))
    pieces, during = gil_turns(lambda: tiktoken_split.split_for_tiktoken(text))
    assert pieces == [text]
    assert during >= 100, during


def test_bad_input(tmp_path):
    with pytest.raises(ValueError, match="folder"):
        get_tokenizer(tmp_path / "missing")
    with pytest.raises(ValueError, match="neither tokenizer.json nor tiktoken.model"):
        get_tokenizer(tmp_path)
    folder = write_tiktoken_folder(tmp_path / "a")
    with pytest.raises(ValueError, match="text"):
        get_tokenizer(folder).encode(b"bytes")
    # A lone surrogate (JSON "\ud800") has no UTF-8: named, in both tokenizer kinds.
    for tok in (get_tokenizer(folder), get_tokenizer(BUILTIN_MODELS[sorted(BUILTIN_MODELS)[0]])):
        with pytest.raises(ValueError, match="not valid Unicode: surrogates not allowed at .* 3"):
            tok.encode("ab \ud800 c")
    (folder / "tiktoken.model").write_text("aGk= 0\nnot-base64!! 1\n")
    with pytest.raises(ValueError, match="tiktoken.model:2"):
        get_tokenizer(folder)
    folder = write_tiktoken_folder(
        tmp_path / "b", added_tokens_decoder={"5": {"content": "[X]", "special": True}}
    )
    with pytest.raises(ValueError, match="added_tokens_decoder"):
        get_tokenizer(folder)


@pytest.mark.parametrize(
    "file, content",
    [
        ("tokenizer.json", b'{"a" 1}'),  # the library's bare Exception, without the file
        ("tokenizer.json", b"\xff\xfe"),
        ("tokenizer_config.json", b"{oops"),  # a JSONDecodeError without the file
        ("tokenizer_config.json", b"\xff"),
        ("config.json", b"[1"),
    ],
)  # fmt: skip
def test_unreadable_tokenizer_files_are_named(tmp_path, file, content):
    folder = tmp_path / "tok"
    shutil.copytree(BUILTIN_MODELS["kimi-linear-tiny"], folder)
    (folder / file).write_bytes(content)
    with pytest.raises(CheckpointError, match=f"^the tokenizer: {re.escape(str(folder / file))}: "):
        get_tokenizer(folder)


def test_a_tiktoken_model_that_is_not_ascii_is_named(tmp_path):
    folder = write_tiktoken_folder(tmp_path / "a")
    (folder / "tiktoken.model").write_bytes("aGk= 0\né 1\n".encode())
    file = re.escape(str(folder / "tiktoken.model"))
    message = f"^the tokenizer: {file}: cannot read it as ASCII"
    with pytest.raises(CheckpointError, match=message):
        get_tokenizer(folder)


@pytest.mark.parametrize("name", [*sorted(BUILTIN_MODELS), "kimi"])
def test_token_bytes_join_into_the_text(name, kimi):
    """Each token's own bytes, also for a token that holds part of a character (its text alone
    is U+FFFD): joined, they are the text's UTF-8 (what chat logprobs' `bytes` promise)."""
    tok = kimi if name == "kimi" else get_tokenizer(BUILTIN_MODELS[name])
    for text in [*TEXTS, "aä 日本 é", "\ufffd itself"]:
        ids = tok.encode(text, add_special_tokens=False)
        assert b"".join(tok.token_bytes(i) for i in ids) == text.encode(), text
    split = [i for i in tok.encode("日本", add_special_tokens=False) if tok.decode([i]) == "\ufffd"]
    assert split and all(tok.token_bytes(i) != "\ufffd".encode() for i in split)
    eos = tok.eos_token_id
    assert tok.token_bytes(eos) == tok.eos_token.encode()
