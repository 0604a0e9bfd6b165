"""The kernel benchmarks' output files and --copy-gib are checked when the flags are parsed: a
usage error naming the flag (exit 2), not a traceback when the first rows are written, after the
first measurements on a GPU."""

import importlib
from pathlib import Path

import pytest

KERNELS = Path(__file__).resolve().parents[2] / "benchmarks" / "kernels"
WITH_CSV = sorted(
    p.stem for p in KERNELS.glob("benchmark_*.py") if '"--csv"' in p.read_text()
    or "add_common_args(" in p.read_text()
)  # fmt: skip


@pytest.fixture(autouse=True)
def kernel_benchmarks_importable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(KERNELS))


def refused(name: str, argv: list[str], capsys: pytest.CaptureFixture) -> str:
    module = importlib.import_module(name)
    with pytest.raises(SystemExit) as exit_info:
        module.main(["--dry-run", *argv])
    assert exit_info.value.code == 2
    return capsys.readouterr().err


def test_every_csv_script_is_checked() -> None:
    assert len(WITH_CSV) >= 12, WITH_CSV


@pytest.mark.parametrize("name", WITH_CSV)
def test_unwritable_csv_is_refused(name: str, tmp_path: Path, capsys) -> None:
    # The words of the engine benchmarks' --output-json (test_engine_benchmarks_dry_run.py).
    out = tmp_path / "no-such-folder" / "rows.csv"
    err = refused(name, ["--csv", str(out)], capsys)
    assert f"argument --csv: cannot write '{out}' (No such file or directory)" in err
    err = refused(name, ["--csv", str(tmp_path)], capsys)
    assert f"argument --csv: '{tmp_path}' is a folder" in err


def test_unwritable_csv_is_refused_before_any_work(
    tmp_path: Path, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    import benchmark_gather_rows

    def work(*args: object) -> int:
        raise AssertionError("the dry run started")

    monkeypatch.setattr(benchmark_gather_rows, "dry_run", work)
    err = refused("benchmark_gather_rows", ["--csv", str(tmp_path)], capsys)
    assert f"argument --csv: '{tmp_path}' is a folder" in err


@pytest.mark.parametrize("name", ["benchmark_gemv", "benchmark_gemv_batched"])
def test_unwritable_output_json_is_refused(name: str, tmp_path: Path, capsys) -> None:
    err = refused(name, ["--output-json", str(tmp_path / "missing" / "out.json")], capsys)
    assert "argument --output-json" in err and "cannot write" in err


@pytest.mark.parametrize("value", ["nan", "inf", "0.5"])
def test_copy_gib_must_be_finite_and_at_least_one(value: str, capsys) -> None:
    err = refused("benchmark_argmax", ["--copy-gib", value], capsys)
    assert "argument --copy-gib: must be >= 1 and finite" in err
