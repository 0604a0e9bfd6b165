"""Running a command-line `main` (the `vllm` command, the scripts under benchmarks/), and the
checks of their arguments that are not engine arguments (those are `EngineArgs`')."""

import argparse
import contextlib
import json
import math
import os
import secrets
import stat
import sys
import tempfile
from collections.abc import Callable, Iterator, Sequence
from typing import Any, TextIO

# The metavar of a flag whose value is a JSON object: such a flag also takes dotted keys. A flag
# whose value is a JSON list has `JSON_LIST_METAVAR` (no keys).
JSON_METAVAR = "JSON"
JSON_LIST_METAVAR = "JSON_LIST"


class FlexibleArgumentParser(argparse.ArgumentParser):
    """An `ArgumentParser` that also reads a long flag spelled with underscores as its dashed
    name (`--max_model_len 4096`, `--max_model_len=4096`), as upstream vLLM's parser does, so
    that commands written for either spelling run. Values are left as they are, and so is
    everything after a bare `--`. Its help takes upstream's search (`--help=SEARCH`:
    `HelpSearchAction`), and its JSON flags upstream's dotted keys (`_json_keys`)."""

    def __init__(self, *args: Any, add_help: bool = True, **kwargs: Any) -> None:
        super().__init__(*args, add_help=False, **kwargs)
        if add_help:
            self.add_argument(
                "-h", "--help", action=HelpSearchAction, nargs="?", metavar="SEARCH",
                default=argparse.SUPPRESS,
                help="show this help and exit; --help=SEARCH shows one flag (max-num-seqs), one "
                "group (engine; listgroup lists them) or the flags whose names contain a word "
                "(--help=max); --help=all is the whole help",
            )  # fmt: skip

    def parse_known_args(  # type: ignore[override]
        self, args: Sequence[str] | None = None, namespace: argparse.Namespace | None = None
    ) -> tuple[argparse.Namespace, list[str]]:
        args = sys.argv[1:] if args is None else list(args)
        end = args.index("--") if "--" in args else len(args)
        # Help without `=` is the whole help, as argparse's: the word after it is not a search.
        head = ["--help=all" if a in ("-h", "--help") else _dashed(a) for a in args[:end]]
        return super().parse_known_args(self._json_keys(head) + args[end:], namespace)

    def _action_named(self, name: str) -> argparse.Action | None:
        """The action a flag names: exactly, or by an abbreviation that argparse would take."""
        if name in self._option_string_actions:
            return self._option_string_actions[name]
        if not (self.allow_abbrev and name.startswith("--")):
            return None
        found = {a for o, a in self._option_string_actions.items() if o.startswith(name)}
        return found.pop() if len(found) == 1 else None

    def _json_keys(self, args: list[str]) -> list[str]:
        """Upstream's dotted form of a JSON flag, read as the JSON it stands for:
        `--attention-config.a.b 1` (or `-ac.a.b=1`) is `--attention-config '{"a": {"b": 1}}'`,
        and `key+ v` appends v to the list at key. Values are JSON where they parse as JSON (`1`,
        `true`, `"1"`), else strings. Unlike upstream, only `key+=v,w` splits at commas (v and
        w); with a space, a value's commas are its own, as in a regex's `{1,2}`. A flag's dotted
        keys make one object, given where the first of them is; a key given twice, or the flag
        given whole as well, is a usage error (which would win is not obvious). JSON flags are
        those whose metavar is `JSON_METAVAR`, of this parser (a subcommand's parser reads its
        own)."""
        objects: dict[argparse.Action, dict] = {}
        out: list[str] = []
        at: dict[argparse.Action, int] = {}  # where each flag's object goes in `out`
        i = 0
        while i < len(args):
            name, eq, inline = args[i].partition("=")
            flag, dot, path = name.partition(".")
            action = self._action_named(flag) if dot and flag.startswith("-") else None
            if action is None or action.metavar != JSON_METAVAR:
                out.append(args[i])
                i += 1
                continue
            if not eq and i + 1 == len(args):
                self.error(f"argument {name}: expected one argument")
            value = inline if eq else args[i + 1]
            try:
                _set_key(objects.setdefault(action, {}), path, value, split=bool(eq))
            except ValueError as e:
                self.error(f"argument {name}: {e}")
            if action not in at:
                at[action] = len(out)
                out.append(max(action.option_strings, key=len))
            i += 1 if eq else 2
        for action, k in sorted(at.items(), key=lambda item: -item[1]):
            for a in out[:k] + out[k + 1 :]:
                if a.startswith("-") and self._action_named(a.partition("=")[0]) is action:
                    flag = out[k]
                    self.error(f"argument {flag}: give it whole (JSON) or as dotted keys, not both")
            out.insert(k + 1, json.dumps(objects[action]))
        return out


def _json_value(text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def _set_key(obj: dict, path: str, value: str, split: bool) -> None:
    """Set `obj`'s dotted `path` to `value`, or append to it where the path ends in `+` (with
    `split`, each comma-separated item); ValueError where a key is empty, set twice, or already
    holds another kind."""
    keys = path.split(".")
    append = keys[-1].endswith("+")
    keys[-1] = keys[-1].removesuffix("+")
    if not all(keys):
        raise ValueError("empty key")
    for key in keys[:-1]:
        obj = obj.setdefault(key, {})
        if not isinstance(obj, dict):
            raise ValueError(f"{key!r} was given a value, so it has no keys")
    if not append:
        if keys[-1] in obj:
            raise ValueError(f"{keys[-1]!r} is given more than once")
        obj[keys[-1]] = _json_value(value)
        return
    items = obj.setdefault(keys[-1], [])
    if not isinstance(items, list):
        raise ValueError(f"{keys[-1]!r} was given a value, so it cannot be appended to")
    items.extend(_json_value(v) for v in (value.split(",") if split else [value]))


class HelpSearchAction(argparse.Action):
    """`--help` (or `--help=all`): the whole help. `--help=SEARCH`, as upstream's: the one flag
    named SEARCH (`max-num-seqs`, `--max_num_seqs`, `tp`), else the argument group whose title,
    or its first word, is SEARCH (`engine`, `server`; `listgroup` lists the titles), else every
    flag whose name contains it (`max`); case and underscores do not matter. A search that
    matches nothing is a usage error that lists the groups. Exits, as argparse's help does."""

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: Any,
        option_string: str | None = None,
    ) -> None:
        if values is None or values.lower() == "all":
            parser.print_help()
            parser.exit()
        word = values.strip().lstrip("-").lower().replace("_", "-")
        flags = [a for a in parser._actions if a.option_strings and a is not self]
        # Groups with something besides this flag (argparse's "options" may hold only it).
        groups = [g for g in parser._action_groups if set(g._group_actions) - {self}]
        titles = [g.title for g in groups]
        if word == "listgroup":
            print("\n".join(titles))
            parser.exit()
        if not word:
            parser.error("argument -h/--help: the search is empty (--help alone: the whole help)")
        named = {o: a for a in flags for o in a.option_strings if o.lstrip("-") == word}
        titled = {g.title.lower(): g for g in groups} | {
            g.title.split()[0].lower(): g for g in groups
        }
        group = titled.get(word)
        if named:
            _print_flags(parser, next(iter(named)), list(dict.fromkeys(named.values())))
        elif group is not None:
            _print_flags(parser, group.title, group._group_actions)
        else:
            found = [a for a in flags if any(word in o.lstrip("-") for o in a.option_strings)]
            if not found:
                parser.error(
                    f"argument -h/--help: no flag or group matches {values!r}; groups: "
                    + ", ".join(titles)
                )
            _print_flags(parser, f"flags matching {values!r}", found)
        parser.exit()


def _print_flags(
    parser: argparse.ArgumentParser, title: str, actions: list[argparse.Action]
) -> None:
    """Print `actions` as argparse's help prints them, under `title`."""
    formatter = parser._get_formatter()
    formatter.start_section(title)
    formatter.add_arguments(actions)
    formatter.end_section()
    print(formatter.format_help(), end="")


def _dashed(arg: str) -> str:
    name, eq, value = arg.partition("=")
    # With a space, argparse reads an argument as a value, not a flag ("--be_brief please").
    if not name.startswith("--") or any(c.isspace() for c in name):
        return arg
    # A JSON flag's dotted keys (`--attention-config.mla_backend`) are the JSON's, kept.
    flag, dot, keys = name.partition(".")
    return flag.replace("_", "-") + dot + keys + eq + value


def given_flags(parser: argparse.ArgumentParser, args: argparse.Namespace) -> dict[str, str]:
    """`{dest: longest flag}` of the options whose parsed value is not their default: those given
    on the command line (argparse lists a parser's options only in its private `_actions`)."""
    return {
        a.dest: max(a.option_strings, key=len)
        for a in parser._actions
        if a.option_strings
        and hasattr(args, a.dest)  # not --help's
        and getattr(args, a.dest) != parser.get_default(a.dest)
    }


def run_main(main: Callable[[], int | None]) -> int | None:
    """`main()`'s exit status, with Ctrl-C (a KeyboardInterrupt out of it) ending the process
    with one line and status 130 (the shell's status for SIGINT) instead of a traceback of
    wherever the interrupt landed. `main`'s own `finally` blocks (engine shutdown, workers
    stopped, the last complete `--output-json` record kept) have run by then."""
    try:
        return main()
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr, flush=True)
        return 130


def output_file(text: str) -> str:
    """argparse `type` of an output file (the benchmarks' `--csv` and `--output-json`): one that
    cannot be written is a usage error naming the flag when the flags are parsed, before any work,
    not a traceback when the first results are written (minutes into a GPU run).

    Checked: not a folder, the file opens for writing, and its folder takes a new file (a writer
    may write a temporary file beside it and rename it over it, as the engine benchmarks do, so
    that an interrupted write keeps the last complete one). A file created to check is removed.
    """
    if os.path.isdir(text):
        raise argparse.ArgumentTypeError(f"{text!r} is a folder")
    existed = os.path.exists(text)
    try:
        with open(text, "a"):
            pass
        if existed:
            # Creating the file showed that its folder takes new files; opening one that was
            # there shows nothing about the folder.
            with tempfile.TemporaryFile(dir=os.path.dirname(text) or "."):
                pass
    except OSError as e:
        raise argparse.ArgumentTypeError(f"cannot write {text!r} ({e.strerror})") from None
    if not existed:
        os.remove(text)
    return text


def _int_at_least(text: str, low: int) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if value < low:
        raise argparse.ArgumentTypeError(f"must be >= {low}, got {value}")
    return value


def positive_int(text: str) -> int:
    """argparse `type` of a size or a count (tokens, batch sizes, repetitions): an integer >= 1,
    else a usage error naming the flag when the flags are parsed, not a traceback (or an empty
    median) once the benchmark has started on the GPU."""
    return _int_at_least(text, 1)


def nonnegative_int(text: str) -> int:
    """argparse `type` of a count where 0 means none (or the default): an integer >= 0."""
    return _int_at_least(text, 0)


def positive_float(text: str) -> float:
    """argparse `type` of a finite number > 0 (NaN and infinity refused)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not 0 < value < math.inf:  # NaN included
        raise argparse.ArgumentTypeError(f"must be a finite number > 0, got {text}")
    return value


@contextlib.contextmanager
def replaced_whole(path: str, newline: str | None = None) -> Iterator[TextIO]:
    """A text file to write `path` whole or not at all: a new file beside it
    (`<path>.<random>.tmp`, created exclusively so that no other file of that name is touched),
    renamed over `path` when the block completes, removed when it raises (a value that cannot be
    encoded, a full disk, Ctrl-C), so that the previous file stays as it was and no temporary file
    is left. A new file gets the mode the umask gives.

    A symlink's target is the file replaced (the link stays), and keeps its permission bits; a
    path that is not a regular file (`/dev/null`, `/dev/stdout`, a pipe) is written in place:
    renaming over it would replace the device or pipe itself (as root, `/dev/null`)."""
    real = os.path.realpath(path)
    try:
        mode = os.stat(real).st_mode
    except FileNotFoundError:
        mode = None
    if mode is not None and not stat.S_ISREG(mode):
        with open(path, "w", newline=newline) as f:
            yield f
        return
    tmp = f"{real}.{secrets.token_hex(8)}.tmp"
    f = open(tmp, "x", newline=newline)
    try:
        with f:
            if mode is not None:
                os.chmod(tmp, stat.S_IMODE(mode))
            yield f
        os.replace(tmp, real)
    except BaseException:
        with contextlib.suppress(OSError):
            os.remove(tmp)
        raise


def write_json(path: str, record: Any, **dump_kwargs: Any) -> None:
    """Write `record` as JSON to `path` whole or not at all (`replaced_whole`). `dump_kwargs` go
    to `json.dump` (indent, default)."""
    with replaced_whole(path) as f:
        json.dump(record, f, **dump_kwargs)
        f.write("\n")
