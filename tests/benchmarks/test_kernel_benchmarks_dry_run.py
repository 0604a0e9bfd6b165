"""The decode-kernel benchmarks run with `--dry-run` (every launch kind once at a tiny shape,
checked against the torch reference; on CPU under the Triton interpreter), so the scripts cannot
rot between GPU runs."""

from pathlib import Path

import pytest

KERNELS = Path(__file__).resolve().parents[2] / "benchmarks" / "kernels"


@pytest.fixture(autouse=True)
def kernel_benchmarks_importable(monkeypatch: pytest.MonkeyPatch) -> None:
    # The scripts import their siblings as run from their folder.
    monkeypatch.syspath_prepend(str(KERNELS))


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


def test_router_dry_run(triton_launches, capsys: pytest.CaptureFixture) -> None:
    import benchmark_router

    assert benchmark_router.main(["--dry-run", "--warps", "1", "2"]) == 0
    assert triton_launches["_grouped_topk_kernel"] > 0  # the kernel, not the reference
    out = capsys.readouterr().out
    assert "kernel[w1]" in out and "kernel[w2]" in out and "reference" in out


def test_all_reduce_dry_run(tmp_path: Path) -> None:
    """Two gloo ranks on the CPU: the script checks the sum of ones and writes one row per size."""
    import benchmark_all_reduce

    out = tmp_path / "ar.csv"
    assert benchmark_all_reduce.main(["--dry-run", "--csv", str(out)]) == 0
    lines = out.read_text().splitlines()
    assert lines[0] == "tokens,bytes,eager_us,graph_us" and len(lines) == 3
    assert lines[1].startswith("1,16,")
