"""The decode-kernel benchmarks run with `--dry-run` (every launch kind once at a tiny shape,
checked against the torch reference; on CPU under the Triton interpreter), so the scripts cannot
rot between GPU runs."""

import importlib
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

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


def test_kda_decode_dry_run_names_the_flags_it_ignores(tmp_path, capsys) -> None:
    """The untimed dry run writes no CSV and runs its own shapes: said, not silently."""
    import benchmark_kda_decode

    csv = tmp_path / "rows.csv"
    assert benchmark_kda_decode.main(["--dry-run", "--csv", str(csv), "--reps", "3"]) == 0
    err = capsys.readouterr().err
    assert f"--dry-run ignores the given --reps 3, --csv {str(csv)!r}\n" in err, err
    assert not csv.exists()
    assert benchmark_kda_decode.main(["--dry-run"]) == 0
    assert "--dry-run ignores" not in capsys.readouterr().err


@pytest.mark.parametrize("flag", ["--gate-proj", "--sweep-gate-proj"])
def test_kda_decode_gate_proj_dry_run(flag, triton_launches, capsys: pytest.CaptureFixture) -> None:
    import benchmark_kda_decode

    # Both flags' dry run is this check of the in-kernel projections; the sweep's own rotation of
    # slots and weights needs a GPU (time_graph) and runs there only.
    assert benchmark_kda_decode.main(["--dry-run", flag]) == 0
    # Each form once on each variant (v32w4 single, v8w1 split), through the kernels.
    assert triton_launches["_fused_kda_decode_kernel"] == 4
    assert triton_launches["_kda_decode_epilogue_kernel"] == 2
    assert "bit for bit: True" in capsys.readouterr().out


def test_mla_decode_dry_run(capsys: pytest.CaptureFixture) -> None:
    import benchmark_mla_decode

    assert benchmark_mla_decode.main(["--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "via Triton" in out and "x5 one" in out and "x5 two" in out
    assert "h32n32w8s2c2 x1" in out and "h16n64w4s2c4 x3 one" in out  # latent chunks
    assert "one launch == two launches: True; counters at 0: True" in out


def test_mla_decode_dry_run_without_the_interpreter_says_so(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    """On CPU without TRITON_INTERPRET=1 the fixed-config launches have no torch fallback: a
    usage error naming the variable, not Triton's "0 active drivers" traceback."""
    import benchmark_mla_decode

    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    with pytest.raises(SystemExit) as exit_info:
        benchmark_mla_decode.main(["--dry-run"])
    assert exit_info.value.code == 2
    assert "--dry-run: the kernel runs on CPU only under TRITON_INTERPRET=1" in (
        capsys.readouterr().err
    )


def test_mla_decode_kernel_configs_parse() -> None:
    import benchmark_mla_decode

    parse = benchmark_mla_decode.parse_kernel_config
    assert parse("32,64,8,5") == (32, 64, 8, 5, 1)
    assert parse("16,64,8,5,c4") == (16, 64, 8, 5, 4)
    for bad in ("32,64,8,5,c3", "32,64,8,5,c4,c4", "32,64,8,c2", "32,64,8,5,t"):
        with pytest.raises(ValueError, match="num_stages"):
            parse(bad)


def test_router_dry_run(triton_launches, capsys: pytest.CaptureFixture) -> None:
    import benchmark_router

    assert benchmark_router.main(["--dry-run", "--warps", "1", "2"]) == 0
    assert triton_launches["_grouped_topk_kernel"] > 0  # the kernel, not the reference
    out = capsys.readouterr().out
    assert "kernel[w1]" in out and "kernel[w2]" in out and "reference" in out


def test_router_logits_dry_run(triton_launches, capsys: pytest.CaptureFixture) -> None:
    import benchmark_router

    argv = ["--dry-run", "--logits", "--logits-configs", "default", "16,32,4,2,3,dot,m16",
            "16,32,4,a,3,dot3"]  # fmt: skip
    assert benchmark_router.main(argv) == 0
    assert triton_launches["_gemv_kernel"] > 0
    out = capsys.readouterr().out
    assert "F.linear" in out and "gemv[16,32,4,2,3,dot,m16]" in out and "fastest" in out
    assert "gemv[16,32,4,a,3,dot3]" in out


def test_router_fused_dry_run(triton_launches, capsys: pytest.CaptureFixture) -> None:
    import benchmark_router

    argv = ["--dry-run", "--fused", "--fused-configs", "default", "32,128,4"]
    assert benchmark_router.main(argv) == 0
    assert triton_launches["_fused_router_topk_kernel"] > 0
    assert triton_launches["_grouped_topk_kernel"] > 0  # the two launches are the kernels too
    out = capsys.readouterr().out
    assert "two launches" in out and "fused[default]" in out and "fused[32,128,4]" in out
    assert "T=3: fastest fused[" in out


def test_router_fused_norm_dry_run(triton_launches, capsys: pytest.CaptureFixture) -> None:
    import benchmark_router

    # H 72: the norm's tile of 128 lanes takes one warp, so the swept config does too
    argv = ["--dry-run", "--fused-norm", "--fused-configs", "default", "8,32,1"]
    assert benchmark_router.main(argv) == 0
    assert triton_launches["_fused_router_topk_kernel"] > 0
    assert triton_launches["_rms_norm_kernel"] > 0  # the unfused side is the kernels too
    out = capsys.readouterr().out
    assert "norm + router (before)" in out and "norm + router[1,128,1]" in out
    assert "fused norm+router[default]" in out and "fused norm+router[8,32,1]" in out
    assert "T=3: fastest fused norm+router[" in out
    with pytest.raises(SystemExit, match="must take the norm kernel's 1 warps"):
        benchmark_router.main(["--dry-run", "--fused-norm", "--fused-configs", "2,64,4"])


def test_all_reduce_dry_run(tmp_path: Path) -> None:
    """Two gloo ranks on the CPU: the script checks the sum of ones and writes one row per size."""
    import benchmark_all_reduce

    out = tmp_path / "ar.csv"
    assert benchmark_all_reduce.main(["--dry-run", "--csv", str(out)]) == 0
    lines = out.read_text().splitlines()
    assert lines[0] == "tokens,bytes,eager_us,graph_us" and len(lines) == 3
    assert lines[1].startswith("1,16,")


def test_gemv_dry_run_with_a_config_sweep(triton_launches, tmp_path: Path) -> None:
    import json

    import benchmark_gemv

    out = tmp_path / "gemv.json"
    argv = ["--dry-run", "--m", "1", "--configs", "default", "8,32,4,2", "16,32,4,1,2,dot",
            "--out", str(out)]  # fmt: skip
    assert benchmark_gemv.main(argv) == 0
    record = json.loads(out.read_text())
    labels = [(r["dtype"], r["config"]) for r in record["rows"]]
    configs = ["vendor", "default", "8,32,4,2", "16,32,4,1,2,dot"]
    assert labels == [(d, c) for d in ("bf16", "fp8") for c in configs]
    assert all(r["us"] > 0 for r in record["rows"])
    # The interpreted kernels ran (not the reference), split-K's reduction included.
    assert triton_launches["_gemv_kernel"] > 0
    assert triton_launches["_gemv_split_reduce_kernel"] > 0


def test_rms_norm_gemv_dry_run(triton_launches, tmp_path: Path, capsys) -> None:
    import csv

    import benchmark_rms_norm_gemv

    out = tmp_path / "rows.csv"
    assert benchmark_rms_norm_gemv.main(["--dry-run", "--csv", str(out)]) == 0
    rows = list(csv.DictReader(out.open()))
    paths = benchmark_rms_norm_gemv.PATHS
    assert [(r["residual"], r["path"]) for r in rows] == [
        (res, p) for res in ("True", "False") for p in paths
    ]
    assert all(float(r["us"]) > 0 for r in rows)
    # Both residual forms checked and timed: the interpreted kernel, not the reference.
    assert triton_launches["_rms_norm_gemv_kernel"] > 2
    assert "fused saves" in capsys.readouterr().out


def test_gemv_static_weight_dry_run(triton_launches, tmp_path: Path, capsys) -> None:
    import csv

    import benchmark_gemv_static_weight as bench

    out = tmp_path / "rows.csv"
    assert bench.main(["--dry-run", "--csv", str(out)]) == 0
    rows = list(csv.DictReader(out.open()))
    assert [(r["chain"], r["mode"]) for r in rows] == [
        (c, m) for c in bench.SHAPES for m in bench.MODES
    ]
    # The GEMV's share on the chains that hold it, from the `before` row timed after them.
    assert all((r["gemv_us"] != "") == (r["mode"] != "before") for r in rows)
    # Checked (static against plain) and timed: the interpreted kernels, not the references.
    assert triton_launches["_gemv_kernel"] > 4
    assert capsys.readouterr().out.count("static saves") == len(bench.SHAPES)


def test_gemv_batched_dry_run(triton_launches, tmp_path: Path, capsys) -> None:
    import json

    import benchmark_gemv_batched

    out = tmp_path / "batched.json"
    argv = ["--dry-run", "--m", "1", "3", "--configs", "default", "8,32,4,1,1",
            "--output-json", str(out)]  # fmt: skip
    assert benchmark_gemv_batched.main(argv) == 0
    rows = json.loads(out.read_text())["rows"]
    assert [(r["m"], r["config"]) for r in rows] == [
        (m, c) for m in (1, 3) for c in ("bmm", "default", "8,32,4,1,1")
    ]
    assert all(r["us"] > 0 for r in rows) and rows[2]["block_n"] == 8
    assert triton_launches["_gemv_kernel"] > 0  # the interpreted kernel, not the reference
    assert "tiny M=3: best GEMV" in capsys.readouterr().out


def test_gemv_suggested_threshold_follows_the_crossover() -> None:
    import benchmark_gemv

    def row(shape, m, path, us):
        return dict(dtype="fp8", shape=shape, m=m, path=path, us=us)

    rows = [row("a", 1, "vendor", 5), row("a", 1, "gemv", 3), row("b", 1, "vendor", 5),
            row("b", 1, "gemv", 4), row("a", 4, "vendor", 5), row("a", 4, "gemv", 4),
            row("b", 4, "vendor", 5), row("b", 4, "gemv", 6), row("a", 8, "vendor", 9),
            row("a", 8, "gemv", 1), row("b", 8, "vendor", 9), row("b", 8, "gemv", 1)]  # fmt: skip
    assert benchmark_gemv.suggest_max_m(rows, "fp8") == 1  # shape b loses at M = 4
    assert benchmark_gemv.suggest_max_m(rows, "bf16") is None
    # tl.dot from M = 4 on: it wins at M = 4 and 16, but shape b loses at M = 8.
    rows += [row("a", 4, "dot", 4), row("b", 4, "dot", 4), row("a", 8, "dot", 2),
             row("b", 8, "dot", 9), row("a", 16, "vendor", 9), row("a", 16, "dot", 1),
             row("b", 16, "vendor", 9), row("b", 16, "dot", 1)]  # fmt: skip
    assert benchmark_gemv.suggest_max_m(rows, "fp8", "dot", above=1) == 4
    assert benchmark_gemv.suggest_max_m(rows, "fp8", "dot", above=8) == 16


def test_gemv_dot_sweep_configs_parse() -> None:
    import benchmark_gemv

    configs = [benchmark_gemv.gemv_config(text) for text in benchmark_gemv.DOT_SWEEP]
    assert all(cfg.use_dot and not cfg.fp8_mma for _, cfg in configs)
    assert {cfg.split_k for _, cfg in configs} == {None, 1, 2, 4, 8}
    label, cfg = benchmark_gemv.with_fp8_mma(*configs[-1])
    assert label == "128,128,4,8,4,dot8,m64" and cfg.fp8_mma and cfg.block_m == 64
    assert benchmark_gemv.gemv_config(label)[1] == cfg


def test_gemv_bad_config_is_a_usage_error() -> None:
    import benchmark_gemv

    with pytest.raises(SystemExit):
        benchmark_gemv.main(["--dry-run", "--configs", "6,32,4"])
    with pytest.raises(SystemExit):
        benchmark_gemv.main(["--dry-run", "--configs", "8,32,4,1,1,dot"])


def test_causal_conv1d_dry_run(triton_launches, capsys: pytest.CaptureFixture) -> None:
    import benchmark_causal_conv1d

    argv = ["--dry-run", "--configs", "default", "4,16,2", "8,32,1,8"]
    assert benchmark_causal_conv1d.main(argv) == 0
    assert triton_launches["_causal_conv1d_prefill_kernel"] == 3  # the kernel, not the reference
    assert "t64c512w4s8 t4c16w2s4 t8c32w1s8" in capsys.readouterr().out  # default first


def test_causal_conv1d_bad_config_is_a_usage_error() -> None:
    import benchmark_causal_conv1d

    with pytest.raises(SystemExit):
        benchmark_causal_conv1d.main(["--dry-run", "--configs", "32,256"])


def test_pdl_launch_benchmark_needs_a_hopper_gpu(capsys: pytest.CaptureFixture) -> None:
    # No dry run: PDL's griddepcontrol has no interpreter path. The script imports and refuses
    # clearly without an sm_90+ GPU.
    import benchmark_pdl_launch

    with pytest.raises(SystemExit) as exit_info:
        benchmark_pdl_launch.main([])
    assert exit_info.value.code == 2
    assert "compute capability 9.0" in capsys.readouterr().err


def test_gather_rows_dry_run(triton_launches, capsys: pytest.CaptureFixture) -> None:
    import benchmark_gather_rows

    assert benchmark_gather_rows.main(["--dry-run", "--configs", "default", "2,32,1"]) == 0
    assert triton_launches["_gather_rows_kernel"] == 2  # the kernel, not the reference
    assert "r16c256w4 r2c32w1" in capsys.readouterr().out


def test_mla_prefill_dry_run(triton_launches, capsys: pytest.CaptureFixture) -> None:
    import benchmark_mla_prefill

    assert benchmark_mla_prefill.main(["--dry-run"]) == 0
    # The key check, the dense operands against torch's copies and the key, the new attention.
    assert triton_launches["_mla_prefill_operands_kernel"] == 4
    out = capsys.readouterr().out
    assert "key and operands bit for bit: True, layer codes bit for bit: True" in out


def test_argmax_dry_run(triton_launches, capsys: pytest.CaptureFixture) -> None:
    import benchmark_argmax

    assert benchmark_argmax.main(["--dry-run", "--target-programs", "1", "2048"]) == 0
    assert triton_launches["_argmax_partial_kernel"] == 2  # the kernels, not the reference
    assert triton_launches["_argmax_pick_kernel"] == 2
    assert "[1, 2048] at N = 3, V = 5000: equal to torch.argmax" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        benchmark_argmax.main(["--rows", "0"])


def test_kda_prefill_dry_run(capsys: pytest.CaptureFixture) -> None:
    import benchmark_kda_prefill

    assert benchmark_kda_prefill.main(["--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "softplus bounded unsafe at T = 45" in out and "FAILED" not in out


def test_kda_prefill_dry_run_fails_where_the_forms_disagree(monkeypatch, capsys) -> None:
    import benchmark_kda_prefill

    real, calls = benchmark_kda_prefill.kda_prefill, []

    def unsafe_off(*args):  # the third call is the unsafe form's: as if its result were wrong
        calls.append(1)
        return real(*args) + (len(calls) == 3)

    monkeypatch.setattr(benchmark_kda_prefill, "kda_prefill", unsafe_off)
    assert benchmark_kda_prefill.main(["--dry-run"]) == 1
    assert "FAILED" in capsys.readouterr().out


COPY_BENCHMARKS = [
    "benchmark_argmax", "benchmark_causal_conv1d", "benchmark_gather_rows", "benchmark_gemv",
    "benchmark_gemv_batched", "benchmark_kda_decode", "benchmark_mla_decode",
    "benchmark_mla_prefill", "benchmark_moe", "benchmark_router",
]  # fmt: skip


@pytest.mark.parametrize("script", COPY_BENCHMARKS)
def test_copy_gib_below_one_is_a_usage_error(script, capsys: pytest.CaptureFixture) -> None:
    module = importlib.import_module(script)
    with pytest.raises(SystemExit) as exit_info:
        module.main(["--dry-run", "--copy-gib", "0.5"])
    assert exit_info.value.code == 2
    assert "--copy-gib: must be >= 1" in capsys.readouterr().err


# No dry run in these: they time the GPU's launch path and torch's GPU attention backends.
GPU_ONLY_BENCHMARKS = ["benchmark_triton_launch", "benchmark_mla_prefill_sdpa"]
# No --copy-gib: compute-bound, timed against its own other forms.
OTHER_DRY_RUN_BENCHMARKS = ["benchmark_kda_prefill"]


@pytest.mark.parametrize("script", COPY_BENCHMARKS + GPU_ONLY_BENCHMARKS + OTHER_DRY_RUN_BENCHMARKS)
def test_benchmarks_refuse_without_a_gpu(script, capsys: pytest.CaptureFixture) -> None:
    # They import, then refuse with a usage error, pointing to --dry-run where they have one.
    if torch.cuda.is_available():
        pytest.skip("a GPU is present")
    module = importlib.import_module(script)
    with pytest.raises(SystemExit) as exit_info:
        module.main([])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "this benchmark needs a CUDA" in err
    if script in COPY_BENCHMARKS:
        assert "GPU (or --dry-run)" in err


def test_kernel_bench_imports_without_triton() -> None:
    # Every script imports it at its top, --dry-run on a CPU without Triton included.
    code = "import sys; sys.modules['triton'] = None; import kernel_bench"
    subprocess.run([sys.executable, "-c", code], cwd=KERNELS, check=True)


def test_kda_gate_proj_dry_run_as_a_script_compares_bits_on_a_cpu() -> None:
    # As its docstring says to run it, outside the test session's interpreter patch: the script
    # must make Triton's interpreter round as the GPU does, or its bit-for-bit check fails.
    if torch.cuda.is_available():
        pytest.skip("a GPU is present")
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    command = [sys.executable, "benchmark_kda_decode.py", "--dry-run", "--gate-proj"]
    result = subprocess.run(command, cwd=KERNELS, env=env, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "bit for bit: True" in result.stdout


def test_time_eager_times_calls_after_a_warm_up() -> None:
    """`kernel_bench.time_eager`: one warm-up call, then the timed ones (one on the CPU, where
    only dry runs time), and the median of those in microseconds."""
    import kernel_bench

    calls = []

    def call() -> None:
        calls.append(1)
        if len(calls) > 1:  # the warm-up call is not timed
            time.sleep(0.002)

    us = kernel_bench.time_eager(call, torch.device("cpu"))
    assert len(calls) == 2 and 2000 <= us < 200_000


@pytest.mark.parametrize("name", ["benchmark_gemv", "benchmark_gemv_batched"])
def test_output_json_is_not_left_half_written(name: str, tmp_path: Path, monkeypatch) -> None:
    """It was opened for writing and streamed into: a write that failed halfway (here a disk
    that fills up) left a truncated, unparsable file in place of the previous run's."""
    import json

    module = importlib.import_module(name)
    out = tmp_path / "out.json"
    out.write_text('{"previous": "run"}')

    def full_disk_after_half(record, f, **kwargs) -> None:
        text = json.dumps(record, **kwargs)
        f.write(text[: len(text) // 2])
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(json, "dump", full_disk_after_half)
    with pytest.raises(OSError, match="No space left"):
        module.main(["--dry-run", "--output-json", str(out)])
    assert json.loads(out.read_text()) == {"previous": "run"}
    assert os.listdir(tmp_path) == ["out.json"]


def test_csv_keeps_the_rows_before_an_interrupted_rewrite(tmp_path: Path, monkeypatch) -> None:
    """The CSV is rewritten after every row; written in place, an interruption during the
    rewrite (here Ctrl-C after the header) lost every row measured before it."""
    import csv

    import kernel_bench

    out = tmp_path / "rows.csv"
    kernel_bench.write_csv(str(out), [{"m": 1, "us": 2.5}])

    def interrupted(self, rows) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(csv.DictWriter, "writerows", interrupted)
    with pytest.raises(KeyboardInterrupt):
        kernel_bench.write_csv(str(out), [{"m": 1, "us": 2.5}, {"m": 2, "us": 3.0}])
    assert out.read_text().splitlines() == ["m,us", "1,2.5"]
    assert os.listdir(tmp_path) == ["rows.csv"]
