"""benchmarks/kernels/benchmark_moe.py runs with `--dry-run` (CPU, tiny shapes) including triton and
tgrouped config sweeps, and its TRITON_MAX_ROWS / TRITON_GROUPED_MAX_ROWS suggestions follow the
measured crossovers."""

import csv
import json
from pathlib import Path

import pytest
import torch

from vllm.triton_utils import use_triton

KERNEL_BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks" / "kernels"


@pytest.fixture(autouse=True)
def benchmarks_importable(monkeypatch: pytest.MonkeyPatch) -> None:
    # The script imports its sibling kernel_bench as run from its folder.
    monkeypatch.syspath_prepend(str(KERNEL_BENCHMARKS))


def test_moe_dry_run_with_a_triton_sweep(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    import benchmark_moe

    out = tmp_path / "moe.csv"
    argv = ["--dry-run", "--tokens", "1", "--paths", "grouped", "triton", "--csv", str(out),
            "--triton-configs", "16,256,4/8,256,4", "default", "32,64,4/64,32,4"]  # fmt: skip
    assert benchmark_moe.main(argv) == 0
    rows = list(csv.DictReader(out.open()))
    paths = [r["path"] for r in rows]
    # Under the interpreter (a CPU-only test run) the triton configs run; else they are skipped.
    triton = ["triton[16,256,4/8,256,4]", "triton", "triton[32,64,4/64,32,4]"]
    assert paths == ["grouped"] + (triton if use_triton(torch.device("cpu")) else [])
    assert all(r["rows"] == "2" and float(r["us"]) > 0 for r in rows)
    if len(paths) > 1:
        assert "TRITON_MAX_ROWS" in capsys.readouterr().out.splitlines()[-1]


def test_moe_dry_run_with_situ(tmp_path: Path, monkeypatch, capsys) -> None:
    """`--activation situ` hands every path Kimi-K3's SiTU; not with --shared-expert."""
    import benchmark_moe

    from vllm.model_executor.layers.activation import SituAndMul

    seen = []

    def spy(x, w13, w2, w, ids, act):
        seen.append(act)
        return torch.zeros_like(x)

    monkeypatch.setitem(benchmark_moe.PATHS, "gathered", spy)
    out = tmp_path / "moe.csv"
    argv = ["--dry-run", "--tokens", "1", "--paths", "gathered", "--activation", "situ",
            "--csv", str(out)]  # fmt: skip
    assert benchmark_moe.main(argv) == 0
    assert seen and all(type(a) is SituAndMul and (a.beta, a.linear_beta) == (4, 25) for a in seen)
    assert [r["activation"] for r in csv.DictReader(out.open())] == ["situ"]
    with pytest.raises(SystemExit):
        benchmark_moe.main(["--dry-run", "--shared-expert", "--activation", "situ"])
    assert "SiLU only" in capsys.readouterr().err


@pytest.mark.parametrize("extra", [["--shared-expert"], ["--routing-histogram", "h.json"]])
def test_k3_shape_refuses_the_kimi_linear_modes(extra, capsys) -> None:
    import benchmark_moe

    with pytest.raises(SystemExit) as exit_info:
        benchmark_moe.main(["--dry-run", "--shape", "kimi-k3-tp8", *extra])
    assert exit_info.value.code == 2
    assert "are kimi-linear's (--shape)" in capsys.readouterr().err


def test_moe_dry_run_with_a_tgrouped_sweep(tmp_path: Path) -> None:
    import benchmark_moe

    out = tmp_path / "moe.csv"
    argv = ["--dry-run", "--tokens", "1", "--paths", "tgrouped", "--csv", str(out),
            "--tgrouped-configs", "16/16,32,2,2/32,16,2,2", "16/32,16,2,2/16,32,2,2"]  # fmt: skip
    assert benchmark_moe.main(argv) == 0
    rows = list(csv.DictReader(out.open()))
    expected = ["tgrouped[16/16,32,2,2/32,16,2,2]", "tgrouped[16/32,16,2,2/16,32,2,2]"]
    assert [r["path"] for r in rows] == (expected if use_triton(torch.device("cpu")) else [])
    assert all(r["rows"] == "2" and float(r["us"]) > 0 for r in rows)


def test_moe_dry_run_times_the_grouping(tmp_path: Path) -> None:
    import benchmark_moe

    out = tmp_path / "moe.csv"
    argv = ["--dry-run", "--tokens", "1", "3", "--paths", "grouping", "--csv", str(out)]
    assert benchmark_moe.main(argv) == 0
    rows = list(csv.DictReader(out.open()))
    # The torch sort always runs; the kernel only where Triton runs (the interpreter here).
    kernel = ["grouping"] if use_triton(torch.device("cpu")) else []
    assert [r["path"] for r in rows] == [*kernel, "grouping:sort"] * 2
    assert [r["rows"] for r in rows] == ["2"] * (len(rows) // 2) + ["6"] * (len(rows) // 2)
    assert all(float(r["us"]) > 0 and r["weight_mb"] == "0" for r in rows)


def test_bad_tgrouped_config_is_a_usage_error() -> None:
    import benchmark_moe

    for bad in ("16/64,128,4,3", "8/64,128,4,3/64,128,4,3", "16/64,128,4,0/64,128,4,3",
                "16/64,96,4,3/64,128,4,3", "16/64,128,4/64,128,4,3",
                "16/64,128,4,3/64,128,4,3/tmb", "32+32/64,128,4,3/64,128,4,3",
                "32+24/64,128,4,3/64,128,4,3", "32+8/64,128,4,3/64,128,4,3",
                "32+/64,128,4,3/64,128,4,3"):  # fmt: skip
        with pytest.raises(SystemExit) as exit_info:
            benchmark_moe.main(["--dry-run", "--tgrouped-configs", bad])
        assert exit_info.value.code == 2


def test_tgrouped_config_takes_the_loads() -> None:
    import benchmark_moe

    name, kwargs = benchmark_moe.tgrouped_config("128/128,64,8,4/128,64,8,3/tma")
    assert name == "tgrouped[128/128,64,8,4/128,64,8,3/tma]"
    assert kwargs["tma"] is True and kwargs["gate_up_stages"] == 4 and kwargs["block_m"] == 128
    assert benchmark_moe.tgrouped_config("16/64,128,4,3/64,128,4,3/ptr")[1]["tma"] is False
    assert "tma" not in benchmark_moe.tgrouped_config("16/64,128,4,3/64,128,4,3")[1]
    assert benchmark_moe.tgrouped_config("default") == ("tgrouped", {})


def test_tgrouped_config_takes_the_tail_tiles() -> None:
    import benchmark_moe

    name, kwargs = benchmark_moe.tgrouped_config("128+32/128,64,8,4/128,64,8,3/tma")
    assert name == "tgrouped[128+32/128,64,8,4/128,64,8,3/tma]"
    assert kwargs["block_m"] == 128 and kwargs["tail_block_m"] == 32 and kwargs["tma"] is True
    assert benchmark_moe.tgrouped_config("128/128,64,8,4/128,64,8,3")[1]["tail_block_m"] == 0


def test_tgrouped_max_rows_suggestion() -> None:
    import benchmark_moe

    def row(rows, path, us):
        return dict(rows=rows, path=path, us=us)

    measured = [
        row(64, "grouped", 100.0), row(64, "tgrouped[a]", 200.0),  # at or below `above`: ignored
        row(256, "grouped", 300.0), row(256, "tgrouped[a]", 250.0), row(256, "triton", 1.0),
        row(512, "grouped", 400.0), row(512, "tgrouped[b]:torch", 350.0),
        row(2048, "grouped", 700.0), row(2048, "tgrouped[a]", 710.0),
    ]  # fmt: skip
    assert benchmark_moe.suggest_max_rows(measured, "tgrouped", 128) == 512
    assert benchmark_moe.suggest_max_rows(measured[-2:], "tgrouped", 128) == 128  # never wins
    assert benchmark_moe.suggest_max_rows(measured[:2], "tgrouped", 128) is None


def test_bad_triton_config_is_a_usage_error() -> None:
    import benchmark_moe

    for bad in ("16,256,4", "16,256,4/8,256", "16,250,4/8,256,4", "a,b,c/d,e,f"):
        with pytest.raises(SystemExit) as exit_info:
            benchmark_moe.main(["--dry-run", "--triton-configs", bad])
        assert exit_info.value.code == 2


def test_triton_max_rows_suggestion() -> None:
    import benchmark_moe

    def row(rows, path, us):
        return dict(rows=rows, path=path, us=us)

    measured = [
        row(8, "grouped", 100.0), row(8, "triton[a]", 90.0), row(8, "triton[b]", 120.0),
        row(64, "grouped", 300.0), row(64, "triton[b]", 250.0), row(64, "gathered", 10.0),
        row(128, "grouped", 400.0), row(128, "triton[a]", 410.0),
        row(512, "grouped", 700.0), row(512, "triton[a]", 650.0),  # a win past a loss: ignored
    ]  # fmt: skip
    assert benchmark_moe.suggest_max_rows(measured, "triton") == 64
    assert benchmark_moe.suggest_max_rows(measured[6:], "triton") == 0  # loses at its smallest
    assert benchmark_moe.suggest_max_rows([row(8, "grouped", 1.0)], "triton") is None
    assert (
        benchmark_moe.suggest_max_rows([row(8, "grouped", 1.0), row(8, "triton", 2.0)], "triton")
        == 0
    )


def test_moe_dry_run_shared_expert_fused_vs_separate(tmp_path: Path) -> None:
    import benchmark_moe

    out = tmp_path / "moe.csv"
    assert (
        benchmark_moe.main(["--dry-run", "--shared-expert", "--tokens", "1", "--csv", str(out)])
        == 0
    )
    rows = list(csv.DictReader(out.open()))
    assert [r["path"] for r in rows] == ["block:fused", "block:separate"]
    # One token's two routed experts plus the shared expert and the router, both layouts alike.
    assert all(r["distinct_experts"] == "2" and float(r["us"]) > 0 for r in rows)
    assert rows[0]["weight_mb"] == rows[1]["weight_mb"]


# Two layers of the dry run's 8 experts, top-2, then the fused shared expert's column.
HISTOGRAM = [[6, 2, 0, 4, 1, 3, 0, 0, 8], [4, 4, 4, 4, 0, 0, 0, 0, 8]]


def test_histogram_routing_gives_each_expert_its_recorded_rows() -> None:
    """The routed rows per expert are the histogram's, an expert never twice in a token, the
    shared column last at weight 1.0, the routed weights a distribution."""
    import benchmark_moe

    cpu = torch.device("cpu")
    for counts in HISTOGRAM:
        weights, ids = benchmark_moe.histogram_routing(counts, 8, 2, 1, cpu, seed=3)
        assert ids.shape == (8, 3) and weights.shape == (8, 3)
        assert torch.bincount(ids[:, :2].flatten(), minlength=8).tolist() == counts[:8]
        assert all(len(set(row)) == 3 for row in ids.tolist())
        assert (ids[:, 2] == 8).all() and (weights[:, 2] == 1.0).all()
        assert torch.allclose(weights[:, :2].sum(dim=1), torch.ones(8))


def test_moe_dry_run_routed_by_a_histogram(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    import benchmark_moe

    hist, out = tmp_path / "hist.json", tmp_path / "moe.csv"
    hist.write_text(json.dumps(HISTOGRAM))
    argv = ["--dry-run", "--paths", "loop", "--fused-shared-experts", "1",
            "--routing-histogram", str(hist), "--layers", "1", "0", "--csv", str(out)]  # fmt: skip
    assert benchmark_moe.main(argv) == 0
    rows = list(csv.DictReader(out.open()))
    assert [(r["layer"], r["tokens"], r["rows"]) for r in rows] == [
        ("1", "8", "24"),
        ("0", "8", "24"),
    ]
    assert [r["distinct_experts"] for r in rows] == ["5", "6"]
    total = sum(float(r["us"]) for r in rows) / 1e3
    assert capsys.readouterr().out.splitlines()[-1].startswith(f"loop: 2 layers {total:.3f} ms,")
    # The same path twice: each pass summed, the passes averaged.
    argv += ["--tokens", "1"]  # ignored with a histogram
    assert benchmark_moe.main(argv[:2] + ["loop", *argv[2:]]) == 0
    rows = list(csv.DictReader(out.open()))
    assert len(rows) == 4
    total = sum(float(r["us"]) for r in rows) / 2 / 1e3
    last = capsys.readouterr().out.splitlines()[-1]
    assert last.startswith(f"loop: 2 layers {total:.3f} ms (mean of 2 passes),")


@pytest.mark.parametrize(
    "layers, extra, message",
    [
        ([[6, 2, 0, 4, 1, 3, 0]], [], "expected 8 routed counts"),
        ([[6, 2, 0, 4, 1, 3, 0, 1]], [], "not tokens x top-2"),
        ([[9, 1, 0, 0, 0, 0, 0, 0]], [], "at most once"),
        ([[6, 2, 0, 4, 1, 3, 0, 0, 7]], ["--fused-shared-experts", "1"], "every token"),
        ([[6, 2, 0, 4, 1, 3, 0, 0, 8]], [], "expected 8 routed counts"),
        ({"0": [1]}, [], "a JSON list"),
        (HISTOGRAM, ["--fused-shared-experts", "1", "--layers", "2"], "layers 0-1"),
    ],
)
def test_bad_histogram_is_a_usage_error(tmp_path, capsys, layers, extra, message) -> None:
    import benchmark_moe

    hist = tmp_path / "hist.json"
    hist.write_text(json.dumps(layers))
    with pytest.raises(SystemExit) as exit_info:
        benchmark_moe.main(
            ["--dry-run", "--paths", "loop", "--routing-histogram", str(hist), *extra]
        )
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


def test_layers_without_a_histogram_is_a_usage_error(capsys) -> None:
    import benchmark_moe

    with pytest.raises(SystemExit) as exit_info:
        benchmark_moe.main(["--dry-run", "--layers", "0"])
    assert exit_info.value.code == 2
    assert "--layers needs --routing-histogram" in capsys.readouterr().err
