"""`output_file`, the argparse type of every benchmark's output file (`--csv`, `--output-json`):
what it refuses, with which words, and that checking leaves the folder as it was."""

import argparse
import errno
import json
import os
import re
from pathlib import Path

import pytest

from vllm.utils.cli import FlexibleArgumentParser, output_file


def test_a_writable_output_file_is_left_as_found(tmp_path: Path) -> None:
    new, old = tmp_path / "new.csv", tmp_path / "old.csv"
    old.write_text("kept")
    assert output_file(str(new)) == str(new) and not new.exists()
    assert output_file(str(old)) == str(old) and old.read_text() == "kept"
    assert os.listdir(tmp_path) == ["old.csv"]


def test_refuses_a_folder_and_a_missing_folder(tmp_path: Path) -> None:
    with pytest.raises(argparse.ArgumentTypeError, match=f"^'{tmp_path}' is a folder$"):
        output_file(str(tmp_path))
    missing = tmp_path / "missing" / "out.json"
    with pytest.raises(argparse.ArgumentTypeError) as error:
        output_file(str(missing))
    assert str(error.value) == f"cannot write '{missing}' (No such file or directory)"
    assert os.listdir(tmp_path) == []


def test_size_types_refuse_what_is_not_a_size() -> None:
    from vllm.utils.cli import nonnegative_int, positive_float, positive_int

    assert (positive_int("3"), nonnegative_int("0"), positive_float("1e-5")) == (3, 0, 1e-5)
    for parse, text, message in [
        (positive_int, "0", "must be >= 1, got 0"),
        (positive_int, "1.5", "not an integer: '1.5'"),
        (nonnegative_int, "-1", "must be >= 0, got -1"),
        (positive_float, "nan", "must be a finite number > 0, got nan"),
        (positive_float, "inf", "must be a finite number > 0, got inf"),
        (positive_float, "0", "must be a finite number > 0, got 0"),
        (positive_float, "x", "not a number: 'x'"),
    ]:
        with pytest.raises(argparse.ArgumentTypeError, match=f"^{re.escape(message)}$"):
            parse(text)


def _full_disk_after_half(record: object, f, **kwargs: object) -> None:
    """`json.dump` on a disk that fills up halfway through the record."""
    text = json.dumps(record, **kwargs)
    f.write(text[: len(text) // 2])
    raise OSError(errno.ENOSPC, "No space left on device")


def test_write_json_is_whole_or_not_at_all(tmp_path: Path, monkeypatch) -> None:
    from vllm.utils.cli import write_json

    out = tmp_path / "out.json"
    write_json(str(out), {"run": 1, "rows": [1, 2]}, indent=1)
    assert json.loads(out.read_text()) == {"run": 1, "rows": [1, 2]}
    monkeypatch.setattr(json, "dump", _full_disk_after_half)
    with pytest.raises(OSError, match="No space left"):
        write_json(str(out), {"run": 2, "rows": list(range(100))})
    monkeypatch.undo()
    assert json.loads(out.read_text()) == {"run": 1, "rows": [1, 2]}  # the last complete one
    assert os.listdir(tmp_path) == ["out.json"]  # no temporary file left behind


def test_flexible_parser_leaves_what_follows_a_bare_double_dash() -> None:
    parser = FlexibleArgumentParser()
    parser.add_argument("--max-len", type=int)
    parser.add_argument("rest", nargs="*")
    args = parser.parse_args(["--max_len=7", "--", "--max_len", "a_b"])
    assert args.max_len == 7 and args.rest == ["--max_len", "a_b"]


def test_replaced_whole_keeps_links_modes_and_devices(tmp_path: Path) -> None:
    from vllm.utils.cli import replaced_whole

    target, link = tmp_path / "target.csv", tmp_path / "link.csv"
    target.write_text("old")
    os.chmod(target, 0o640)
    link.symlink_to(target)
    with replaced_whole(str(link)) as f:
        f.write("new")
    # The link still points at the file, which has the new text and its permission bits.
    assert link.is_symlink() and target.read_text() == "new"
    assert (target.stat().st_mode & 0o777) == 0o640
    assert sorted(os.listdir(tmp_path)) == ["link.csv", "target.csv"]
    # A FIFO (as /dev/null or /dev/stdout) is written through, not renamed over.
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    fd = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
    try:
        with replaced_whole(str(fifo)) as f:
            f.write("row\n")
        assert os.read(fd, 100) == b"row\n"
    finally:
        os.close(fd)
    assert fifo.is_fifo()


def test_flexible_parser_leaves_a_value_with_a_space() -> None:
    # argparse takes an argument with a space as a value even where it starts with "--".
    parser = FlexibleArgumentParser()
    parser.add_argument("--api-key")
    parser.add_argument("--max-len", type=int)
    args = parser.parse_args(["--api_key", "--my_key x", "--max_len", "-3"])
    assert args.api_key == "--my_key x" and args.max_len == -3
    assert parser.parse_args(["--api_key=", "--max_len=4"]).api_key == ""
    # After an `=`, only the name is re-spelled.
    assert parser.parse_args(["--api_key=a_b=c_d"]).api_key == "a_b=c_d"


def test_replaced_whole_leaves_a_file_named_like_its_temporary(tmp_path: Path) -> None:
    # A user's own `<path>.tmp` (or a second writer's) is neither overwritten nor renamed away.
    from vllm.utils.cli import replaced_whole

    out, theirs = tmp_path / "out.json", tmp_path / "out.json.tmp"
    theirs.write_text("theirs")
    with replaced_whole(str(out)) as f:
        f.write("ours")
    assert out.read_text() == "ours" and theirs.read_text() == "theirs"
    assert sorted(os.listdir(tmp_path)) == ["out.json", "out.json.tmp"]


def test_replaced_whole_gives_a_new_file_the_umasks_mode(tmp_path: Path) -> None:
    from vllm.utils.cli import replaced_whole

    old = os.umask(0o027)
    try:
        with replaced_whole(str(tmp_path / "new.csv")) as f:
            f.write("row\n")
    finally:
        os.umask(old)
    assert ((tmp_path / "new.csv").stat().st_mode & 0o777) == 0o640


def _searchable() -> FlexibleArgumentParser:
    parser = FlexibleArgumentParser(prog="demo")
    parser.add_argument("model", nargs="?", help="the model")
    engine = parser.add_argument_group("engine (fields)")
    engine.add_argument("--max-num-seqs", type=int, help="sequences in flight")
    engine.add_argument("--max-model-len", help="prompt+output tokens")
    server = parser.add_argument_group("server")
    server.add_argument("--port", type=int, help="TCP port")
    server.add_argument("--max-log-len", type=int, help="prompt ids logged")
    return parser


def _help(argv: list[str], capsys: pytest.CaptureFixture) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as exit_info:
        _searchable().parse_args(argv)
    out, err = capsys.readouterr()
    return exit_info.value.code, out, err


def _flags_shown(text: str) -> list[str]:
    return re.findall(r"^  (--[a-z-]+)", text, flags=re.M)


@pytest.mark.parametrize(
    "argv, title, flags",
    [
        # One flag by its name, in any spelling; a group by its title's start; else a word.
        (["--help=max-num-seqs"], "--max-num-seqs:", ["--max-num-seqs"]),
        (["--help=--MAX_NUM_SEQS"], "--max-num-seqs:", ["--max-num-seqs"]),
        (["-h=server"], "server:", ["--port", "--max-log-len"]),
        (["--help=Engine"], "engine (fields):", ["--max-num-seqs", "--max-model-len"]),
        # A group by its title or the title's first word, not by a part of it.
        (["--help=po"], "flags matching 'po':", ["--port"]),
        (["--help=max"], "flags matching 'max':",
         ["--max-num-seqs", "--max-model-len", "--max-log-len"]),
        (["--help=len"], "flags matching 'len':", ["--max-model-len", "--max-log-len"]),
    ],
)  # fmt: skip
def test_help_search_shows_what_matches_and_only_that(
    argv: list[str], title: str, flags: list[str], capsys: pytest.CaptureFixture
) -> None:
    code, out, err = _help(argv, capsys)
    assert (code, err) == (0, "")
    assert out.splitlines()[0] == title, out
    assert _flags_shown(out) == flags, out


def test_help_alone_or_all_is_the_whole_help_and_listgroup_the_titles(capsys) -> None:
    whole = _help(["--help"], capsys)
    assert whole[0] == 0 and whole[1].startswith("usage: demo [-h [SEARCH]]")
    assert "  -h [SEARCH], --help [SEARCH]" in whole[1]
    assert _flags_shown(whole[1]) == [
        "--max-num-seqs",
        "--max-model-len",
        "--port",
        "--max-log-len",
    ]
    assert _help(["--help=all"], capsys) == whole
    # "options" holds only --help here, so it is no group to search.
    code, out, _ = _help(["--help=listgroup"], capsys)
    assert (code, out) == (0, "positional arguments\nengine (fields)\nserver\n")


@pytest.mark.parametrize("argv", [["-h", "server"], ["--help", "max"], ["server", "--help"]])
def test_help_without_equals_is_the_whole_help_and_takes_no_word(argv, capsys) -> None:
    """As argparse's: `vllm --help serve` is vllm's help, `serve -h MODEL` serve's."""
    code, out, err = _help(argv, capsys)
    assert (code, err) == (0, "") and out.startswith("usage: demo")
    assert _flags_shown(out) == ["--max-num-seqs", "--max-model-len", "--port", "--max-log-len"]


def test_help_leaves_nothing_in_the_parsed_arguments() -> None:
    assert vars(_searchable().parse_args(["m"])) == {
        "model": "m", "max_num_seqs": None, "max_model_len": None, "port": None,
        "max_log_len": None,
    }  # fmt: skip


def test_help_search_that_matches_nothing_is_a_usage_error(capsys) -> None:
    code, out, err = _help(["--help=ModelConfig"], capsys)
    assert (code, out) == (2, "")
    assert err.splitlines()[-1] == (
        "demo: error: argument -h/--help: no flag or group matches 'ModelConfig'; groups: "
        "positional arguments, engine (fields), server"
    )
    assert _help(["--help="], capsys)[0] == 2


def test_vllm_serve_help_search(capsys) -> None:
    from vllm.entrypoints.cli.main import main

    with pytest.raises(SystemExit) as exit_info:
        main(["serve", "--help=kv_cache"])
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    assert _flags_shown(out) == ["--kv-cache-memory-bytes", "--kv-cache-dtype"], out


def _json_parser() -> FlexibleArgumentParser:
    parser = FlexibleArgumentParser(prog="demo")
    parser.add_argument("--attention-config", "-ac", metavar="JSON", help="a JSON object")
    parser.add_argument("--max-model-len", help="not JSON")
    return parser


@pytest.mark.parametrize(
    "argv, expected",
    [
        # Keys keep their underscores (the flag's part is dashed); values are JSON where they
        # parse, else strings; nested keys make nested objects; `+` appends.
        (["--attention_config.mla_prefill_backend", "FLASH_ATTN", "--max_model_len", "4",
          "--attention-config.a.b=3", "--attention-config.a.c", "true"],
         {"mla_prefill_backend": "FLASH_ATTN", "a": {"b": 3, "c": True}}),
        (["--attention-config.l+", "x", "--attention-config.l+=1,y", "--attention-config.s",
          '"1"'], {"l": ["x", 1, "y"], "s": "1"}),
        # With a space the value is one item, commas and all (a regex's {1,2}).
        (["--attention-config.ignore+", "re:a{1,2}"], {"ignore": ["re:a{1,2}"]}),
        # The short flag, and an abbreviation argparse would take.
        (["-ac.a", "1", "--attention-conf.b=x"], {"a": 1, "b": "x"}),
    ],
)  # fmt: skip
def test_dotted_keys_of_a_json_flag_are_its_json(argv: list[str], expected: dict) -> None:
    args = _json_parser().parse_args(argv)
    assert json.loads(args.attention_config) == expected
    assert args.max_model_len == ("4" if "--max_model_len" in argv else None)


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--attention-config.a"], "argument --attention-config.a: expected one argument"),
        (["--attention-config", "{}", "--attention-config.a", "1"],
         "argument --attention-config: give it whole (JSON) or as dotted keys, not both"),
        (["--attention-config.a", "1", "--attention-config.a.b", "2"],
         "argument --attention-config.a.b: 'a' was given a value, so it has no keys"),
        (["--attention-config.a", "1", "--attention-config.a+", "2"],
         "argument --attention-config.a+: 'a' was given a value, so it cannot be appended to"),
        (["--attention-config..a", "1"], "argument --attention-config..a: empty key"),
        (["--attention-config.a", "1", "-ac.a", "2"],
         "argument -ac.a: 'a' is given more than once"),
        (["-ac.a", "1", "--attention-conf", "{}"],
         "argument --attention-config: give it whole (JSON) or as dotted keys, not both"),
        # A flag that is not JSON takes no keys.
        (["--max-model-len.a", "1"], "unrecognized arguments: --max-model-len.a 1"),
    ],
)  # fmt: skip
def test_dotted_keys_that_cannot_be_json_are_usage_errors(
    argv: list[str], message: str, capsys: pytest.CaptureFixture
) -> None:
    with pytest.raises(SystemExit) as exit_info:
        _json_parser().parse_args(argv)
    assert exit_info.value.code == 2
    assert capsys.readouterr().err.splitlines()[-1] == f"demo: error: {message}"


def test_vllm_serve_reads_the_recipes_json_flags_as_dotted_keys() -> None:
    from vllm.entrypoints.cli.main import make_parser

    args = make_parser().parse_args(
        ["serve", "kimi-k3-tiny", "--quantization-config.linear", "fp8_per_channel",
         "--quantization-config.ignore+", r"re:(?!.*self_attn\.o_proj$).*",
         "--attention-config.mla_prefill_backend", "FLASH_ATTN"]
    )  # fmt: skip
    assert json.loads(args.quantization_config) == {
        "linear": "fp8_per_channel",
        "ignore": [r"re:(?!.*self_attn\.o_proj$).*"],
    }
    assert json.loads(args.attention_config) == {"mla_prefill_backend": "FLASH_ATTN"}
    # A JSON list's flag takes no keys.
    with pytest.raises(SystemExit):
        make_parser().parse_args(["serve", "--allowed-origins.a", "x"])
