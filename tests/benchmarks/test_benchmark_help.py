"""Every flag of every benchmark script says in --help what it does (a flag with no help text
shows only its name and metavar: `--seed SEED`, `--batch-sizes BATCH_SIZES [...]`)."""

import argparse
import importlib
import inspect
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
SCRIPTS = sorted(
    p
    for p in [*BENCHMARKS.glob("*.py"), *BENCHMARKS.glob("*/*.py")]
    if "def main(" in p.read_text()
)


class Parsed(Exception):
    """The script's parser, caught where it would parse the command line."""


def test_every_script_is_checked() -> None:
    names = {p.stem for p in SCRIPTS}
    assert {"benchmark_latency", "benchmark_host_overhead", "benchmark_load",
            "benchmark_gemv", "benchmark_router", "run_gsm8k_pairs"} <= names  # fmt: skip


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.stem)
def test_every_flag_has_help(script: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(script.parent))
    module = importlib.import_module(script.stem)

    def parse_args(self: argparse.ArgumentParser, *args: object, **kwargs: object) -> None:
        raise Parsed(self)

    monkeypatch.setattr(argparse.ArgumentParser, "parse_args", parse_args)
    with pytest.raises(Parsed) as parsed:
        # The accuracy scripts' main() reads sys.argv; the parser is caught before it does.
        module.main([]) if inspect.signature(module.main).parameters else module.main()
    parser = parsed.value.args[0]
    missing = [a.option_strings or [a.dest] for a in parser._actions if not a.help]
    assert not missing, f"{script.name}: flags without help: {missing}"
