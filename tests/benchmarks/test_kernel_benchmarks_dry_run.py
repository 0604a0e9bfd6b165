"""The kernel benchmarks run with `--dry-run` (CPU, tiny shapes; the decode kernels once per launch
kind, checked against the torch reference under the Triton interpreter), so the scripts cannot rot
between GPU runs."""

import json
from pathlib import Path

import pytest

KERNEL_BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks" / "kernels"


@pytest.fixture(autouse=True)
def benchmarks_importable(monkeypatch: pytest.MonkeyPatch) -> None:
    # The scripts import their siblings as run from their folder.
    monkeypatch.syspath_prepend(str(KERNEL_BENCHMARKS))


def test_kda_decode_dry_run(triton_launches, capsys: pytest.CaptureFixture) -> None:
    import benchmark_kda_decode

    assert benchmark_kda_decode.main(["--dry-run"]) == 0
    assert triton_launches["_fused_kda_decode_kernel"] == 3  # the kernels, not the reference
    assert triton_launches["_kda_decode_epilogue_kernel"] == 2
    assert "v32w4 v16w2 v8w1" in capsys.readouterr().out


def test_mla_decode_dry_run(capsys: pytest.CaptureFixture) -> None:
    import benchmark_mla_decode

    assert benchmark_mla_decode.main(["--dry-run"]) == 0
    assert "via Triton" in capsys.readouterr().out


def test_small_m_gemm_dry_run(tmp_path: Path) -> None:
    import benchmark_small_m_gemm as bench

    out = tmp_path / "small_m.json"
    assert bench.main(["--dry-run", "--output-json", str(out)]) == 0
    record = json.loads(out.read_text())
    cases = {(r["shape"], r["M"], r["provider"]) for r in record["rows"]}
    expected = set()
    for shape in bench.DRY_RUN_SHAPES:
        providers = (bench.FP8_PROVIDERS if shape.fp8 else ()) + bench.BF16_PROVIDERS
        for m in bench.DRY_RUN_M:
            expected |= {
                (shape.name, m, p) for p in providers if m <= bench.MAX_M or "triton" not in p
            }
    assert cases == expected
    assert all(r["us"] > 0 and {"weight_GBps", "pct_copy"} <= r.keys() for r in record["rows"])
    assert set(record["thresholds"]["bf16"]) == {s.name for s in bench.DRY_RUN_SHAPES}
    assert set(record["suggested"]) == {"fp8", "bf16"}


def test_small_m_gemm_sweep_dry_run(tmp_path: Path) -> None:
    import benchmark_small_m_gemm as bench

    out = tmp_path / "sweep.json"
    assert bench.main(["--dry-run", "--sweep", "--output-json", str(out)]) == 0
    rows = json.loads(out.read_text())["rows"]
    assert {r["M"] for r in rows} == set(bench.DRY_RUN_M[:2])
    assert sum(r["default"] for r in rows) == 2  # the default config timed once per M


def test_small_m_gemm_thresholds_stop_at_the_first_loss() -> None:
    import benchmark_small_m_gemm as bench

    times = {1: {"new": 1.0, "old": 2.0}, 2: {"new": 1.0, "old": 2.0}, 4: {"new": 3.0, "old": 2.0},
             8: {"new": 1.0, "old": 2.0}, 16: {"old": 2.0}}  # fmt: skip
    assert bench.suggested_threshold(times, "new", "old") == 2
    assert bench.suggested_threshold({1: {"new": 3.0, "old": 2.0}}, "new", "old") == 0
