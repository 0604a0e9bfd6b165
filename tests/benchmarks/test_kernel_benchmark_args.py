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


@pytest.mark.parametrize(
    "argv, message",
    [
        # Failed in the launch with a traceback, after the reference had been timed.
        (["--warps", "3"], "argument --warps: must be a power of two up to 32, got 3"),
        (["--warps", "64"], "argument --warps: must be a power of two up to 32, got 64"),
        # The second was dropped silently.
        (["--logits", "--fused"], "argument --fused: not allowed with argument --logits"),
        (["--fused", "--fused-norm"], "argument --fused-norm: not allowed with argument --fused"),
    ],
)
def test_router_flags_that_cannot_run_are_refused(argv, message, capsys) -> None:
    module = importlib.import_module("benchmark_router")
    with pytest.raises(SystemExit) as exit_info:
        module.main(argv)
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


@pytest.mark.parametrize(
    "name, argv, message",
    [
        ("benchmark_kda_decode", ["--lower-bound", "nan"], "must be in [-5, 0), got nan"),
        ("benchmark_kda_decode", ["--lower-bound", "0"], "must be in [-5, 0), got 0"),
        ("benchmark_mla_decode", ["--ref-max-gib", "-1"], "must be a finite number > 0, got -1"),
    ],
)  # fmt: skip
def test_gpu_only_numbers_are_checked_as_parsed(name, argv, message, capsys) -> None:
    """Taken as given (NaN, a bound the gate cannot have, a negative budget), to misbehave on a
    GPU only."""
    with pytest.raises(SystemExit) as exit_info:
        importlib.import_module(name).main(argv)
    assert exit_info.value.code == 2
    assert f"argument {argv[0]}: {message}" in capsys.readouterr().err


def test_kda_decode_gate_proj_modes_exclude_each_other(capsys) -> None:
    """--gate-proj replaces the sweep; with --sweep-gate-proj as well one of them was dropped."""
    with pytest.raises(SystemExit) as exit_info:
        importlib.import_module("benchmark_kda_decode").main(["--gate-proj", "--sweep-gate-proj"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "--gate-proj replaces the sweep that --sweep-gate-proj changes" in err


def test_kda_decode_sweep_gate_proj_takes_only_the_engines_batches(capsys) -> None:
    """Above GATE_PROJ_MAX_BATCH the layer runs the projections as linears: a sweep with them in
    the kernel would time a call the engine never makes (the default --batches go to 256)."""
    module = importlib.import_module("benchmark_kda_decode")
    for argv in (["--sweep-gate-proj"], ["--sweep-gate-proj", "--batches", "4", "17"]):
        with pytest.raises(SystemExit) as exit_info:
            module.main(argv)
        assert exit_info.value.code == 2
        assert "give --batches up to 16" in capsys.readouterr().err


@pytest.mark.parametrize(
    "name, flag, value",
    [
        ("benchmark_all_reduce", "--tokens", "0"), ("benchmark_all_reduce", "--hidden", "-1"),
        ("benchmark_all_reduce", "--graph-calls", "0"), ("benchmark_all_reduce", "--reps", "0"),
        ("benchmark_argmax", "--calls", "0"), ("benchmark_argmax", "--reps", "-1"),
        ("benchmark_causal_conv1d", "--tokens", "0"), ("benchmark_causal_conv1d", "--seqs", "-1"),
        ("benchmark_causal_conv1d", "--reps", "0"),
        ("benchmark_gather_rows", "--tokens", "-1"), ("benchmark_gather_rows", "--reps", "0"),
        ("benchmark_kda_prefill", "--tokens", "0"), ("benchmark_kda_prefill", "--seqs", "-1"),
        ("benchmark_kda_prefill", "--heads", "0"), ("benchmark_kda_prefill", "--reps", "0"),
        ("benchmark_kda_decode", "--batches", "0"), ("benchmark_kda_decode", "--reps", "0"),
        ("benchmark_kda_decode", "--graph-calls", "-1"),
        ("benchmark_kda_decode", "--compare-batches", "0"),
        ("benchmark_mla_decode", "--batches", "0"), ("benchmark_mla_decode", "--contexts", "-1"),
        ("benchmark_mla_decode", "--block-size", "0"), ("benchmark_mla_decode", "--capacity", "-1"),
        ("benchmark_mla_decode", "--graph-calls", "0"), ("benchmark_mla_decode", "--reps", "0"),
        ("benchmark_mla_prefill", "--ctx", "0"), ("benchmark_mla_prefill", "--reps", "-1"),
        ("benchmark_moe", "--tokens", "0"), ("benchmark_moe", "--graph-calls", "0"),
        ("benchmark_moe", "--fused-shared-experts", "-1"),
        ("benchmark_pdl_launch", "--weight-cols", "0"),
        ("benchmark_rmsnorm_gated_fp8_per_token", "--tokens", "0"),
        ("benchmark_rmsnorm_gated_fp8_per_token", "--heads", "-1"),
        ("benchmark_rmsnorm_gated_fp8_per_token", "--head-dim", "0"),
        ("benchmark_rmsnorm_gated_fp8_per_token", "--eps", "nan"),
        ("benchmark_rmsnorm_gated_fp8_per_token", "--eps", "-1"),
        ("benchmark_rmsnorm_gated_fp8_per_token", "--strided-gate-heads", "-1"),
        ("benchmark_rmsnorm_gated_fp8_per_token", "--graph-max-tokens", "-1"),
        ("benchmark_rmsnorm_gated_fp8_per_token", "--graph-calls", "0"),
        ("benchmark_router", "--tokens", "0"), ("benchmark_router", "--topk-group", "0"),
        ("benchmark_router", "--warps", "-1"), ("benchmark_router", "--graph-calls", "0"),
        ("benchmark_router", "--hidden", "0"), ("benchmark_router", "--layers", "0"),
    ],
)  # fmt: skip
def test_zero_or_negative_sizes_are_refused_by_flag(name, flag, value, capsys) -> None:
    """Were taken as given: on a GPU the benchmark measured the copy bandwidth, then failed with a
    traceback (negative shapes, an empty median of 0 reps, a division by a 0 block size). Refused
    as the flags are parsed, before the GPU check, so on this CPU host too."""
    module = importlib.import_module(name)
    with pytest.raises(SystemExit) as exit_info:
        module.main([flag, value])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    low = "0" if flag in ("--capacity", "--fused-shared-experts", "--strided-gate-heads",
                          "--graph-max-tokens") else "1"  # fmt: skip
    expected = "must be a finite number > 0" if flag == "--eps" else f"must be >= {low}"
    assert f"argument {flag}: {expected}, got {value}" in err, err
