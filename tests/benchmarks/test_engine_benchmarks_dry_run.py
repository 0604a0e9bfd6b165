"""The engine benchmarks run end to end with `--dry-run` (CPU, kimi-k3-tiny, tiny sizes) and write
a JSON record with every case measured: the scripts cannot rot between GPU runs."""

import importlib
import json
import logging
import math
import os
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


@pytest.fixture(autouse=True)
def benchmarks_importable(monkeypatch: pytest.MonkeyPatch, torch_reference_kernels) -> None:
    # The scripts import their sibling `bench_utils` as run from their folder.
    monkeypatch.syspath_prepend(str(BENCHMARKS))


def test_latency_dry_run(tmp_path: Path) -> None:
    import benchmark_latency

    out = tmp_path / "latency.json"
    assert benchmark_latency.main(["--dry-run", "--output-json", str(out)]) == 0
    record = json.loads(out.read_text())
    assert record["complete"] is True
    assert [(p["phase"], p["input_len"]) for p in record["prefill"]] == [
        ("single prompt", 8), ("batch", 8), ("single prompt", 20), ("batch", 20),
    ]  # fmt: skip
    fp = record["footprint"]
    for p in record["prefill"]:
        assert ("profile" in p) == (p["phase"] == "single prompt")  # the dry run profiles prefill
        if p["phase"] == "single prompt":  # --prefill-reps 3 (the default): their median
            each = p["seconds_each"]
            assert len(each) == 3 and p["seconds"] == sorted(each)[1]
            assert math.isclose(p["tokens_per_s"], p["input_len"] / sorted(each)[1])
        if "profile" not in p:
            continue
        prof, length = p["profile"], p["input_len"]
        # --max-num-batched-tokens 16: 8 tokens in one chunk, 20 in two.
        assert prof["input_len"] == length and prof["chunks"] == prof["steps"] == -(-length // 16)
        flops = 2 * (fp["active_params_without_lm_head"] * length + fp["lm_head_params"])
        assert math.isclose(prof["tflops"], flops / prof["seconds"] / 1e12)
        peak = record["ceilings"]["matmul_bf16_tflops"]
        assert math.isclose(prof["pct_of_matmul_peak"], 100 * prof["tflops"] / peak)
        assert prof["tflops_with_attention"] > prof["tflops"]
        # The groups share out the device's busy time, which is part of the wall time.
        assert math.isclose(sum(g["pct_of_step"] for g in prof["groups"]),
                            prof["pct_device_busy"])  # fmt: skip
        assert 0 < prof["device_busy_s"] <= prof["seconds"]
        groups = {g["group"]: g for g in prof["groups"]}
        assert groups["bf16 GEMM / GEMV"]["bound"] in ("bytes", "FLOPs")
        assert groups["bf16 GEMM / GEMV"]["floor_us"] > 0
        assert prof["kernels"] and all(k["us_per_step"] > 0 for k in prof["kernels"])
    cases = [(d["input_len"], d["batch"]) for d in record["decode"]]
    assert cases == [(8, 2), (8, 1), (20, 2), (20, 1)]
    for d in record["decode"]:
        assert d["distinct_experts_source"] == "measured" and d["step_over_floor"] > 0
        assert len(d["distinct_experts"]) == record["footprint"]["num_moe_layers"]
        groups = {g["group"]: g for g in d["profile"]["groups"]}  # the dry run profiles one step
        assert groups["bf16 GEMM / GEMV"]["us_per_step"] > 0
        assert groups["bf16 GEMM / GEMV"]["pct_of_floor"] > 0


def test_warm_up_bands_stop_at_the_largest_prefill_one_step_holds() -> None:
    """`run_warm_up_bands` runs each warm-up step as its own batch of requests, none larger than
    max_num_seqs prompts (the scheduler admits no more sequences: 8 prompts of 32 tokens cap the
    step at 256 tokens however large the token budget), each run to completion."""
    from types import SimpleNamespace

    from bench_utils import run_warm_up_bands

    class Engine:
        config = SimpleNamespace(
            scheduler_config=SimpleNamespace(max_num_batched_tokens=8192, max_num_seqs=8),
            model_config=SimpleNamespace(vocab_size=100),
        )

        def __init__(self) -> None:
            self.batches: list[list[int]] = [[]]

        def add_request(self, request_id: str, prompt: list[int], params) -> None:
            assert params.max_tokens == 2
            self.batches[-1].append(len(prompt))

        def has_unfinished_requests(self) -> bool:
            return bool(self.batches[-1])

        def step(self) -> None:
            self.batches.append([])

    engine = Engine()
    run_warm_up_bands(engine, 32, seed=0)
    assert engine.batches[:-1] == [[32] * 7 + [31], [32] * 8]


def test_latency_run_that_fails_keeps_its_cases_marked_incomplete(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import benchmark_latency

    run_context = benchmark_latency.Sweep.run_context

    def fail_at_the_second_length(self, length, *args, **kwargs):
        if length == 20:
            raise RuntimeError("the device fell over")
        return run_context(self, length, *args, **kwargs)

    monkeypatch.setattr(benchmark_latency.Sweep, "run_context", fail_at_the_second_length)
    out = tmp_path / "latency.json"
    with pytest.raises(RuntimeError, match="fell over"):
        benchmark_latency.main(["--dry-run", "--output-json", str(out)])
    record = json.loads(out.read_text())
    assert record["complete"] is False and "total_s" not in record
    assert [(d["input_len"], d["batch"]) for d in record["decode"]] == [(8, 2), (8, 1)]


def test_throughput_dry_run(tmp_path: Path) -> None:
    import benchmark_throughput

    out = tmp_path / "throughput.json"
    assert benchmark_throughput.main(["--dry-run", "--output-json", str(out)]) == 0
    record = json.loads(out.read_text())
    results = record["results"]
    assert results["requests_per_s"] > 0 and results["decode_only_steps"]["steps"] > 0
    # The engine the run measured, as sized by the script (3 prompts of 12 + 3 tokens, 2 at once).
    engine = record["engine"]
    assert (engine["max_num_seqs"], engine["max_model_len"]) == (2, 15)
    assert engine["kv_cache_memory"] > 0 and engine["num_blocks"] > 0
    assert engine["tensor_parallel_size"] == 1


@pytest.mark.parametrize("name", ["benchmark_latency", "benchmark_throughput"])
def test_an_argument_is_warned_of_once_per_run(
    name: str, tmp_path: Path, vllm_records: list[logging.LogRecord]
) -> None:
    """The engine config is built once and passed on to the cache sizing and the engine: each
    build warned of `--enable-prefix-caching` (taken, with no effect) again, three or four times
    a run."""
    module = importlib.import_module(name)
    argv = ["--dry-run", "--enable-prefix-caching", "--output-json", str(tmp_path / "r.json")]
    assert module.main(argv) == 0
    said = [r for r in vllm_records if "enable_prefix_caching has no effect" in r.getMessage()]
    assert len(said) == 1, [r.getMessage() for r in vllm_records]


@pytest.mark.parametrize(
    "name, argv, first_step",
    [
        ("benchmark_latency", [], "check_args"),
        ("benchmark_throughput", [], "check_args"),
        ("benchmark_tp_greedy", [], "check_args"),
        ("benchmark_load", ["--out", "x"], "check_out"),
    ],
)
@pytest.mark.parametrize("folder", [False, True], ids=["missing-folder", "a-folder"])
def test_unwritable_output_json_is_refused_before_any_work(
    tmp_path: Path,
    capsys: pytest.CaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
    name: str,
    argv: list[str],
    first_step: str,
    folder: bool,
) -> None:
    """Refused as the flags are parsed, in the kernel benchmarks' words for --csv
    (test_kernel_benchmark_args.py). A folder used to pass the check and fail when the record
    was renamed over it, after the whole run."""
    module = importlib.import_module(name)

    def first(*args: object) -> None:
        raise AssertionError(f"{name} went on past its flags")

    monkeypatch.setattr(module, first_step, first)
    out = tmp_path if folder else tmp_path / "no-such-folder" / "result.json"
    with pytest.raises(SystemExit) as exit_info:
        module.main(["--dry-run", "--output-json", str(out), *argv])
    assert exit_info.value.code == 2
    why = f"'{out}' is a folder" if folder else f"cannot write '{out}' (No such file or directory)"
    assert f"argument --output-json: {why}" in capsys.readouterr().err
    assert os.listdir(tmp_path) == []


def test_help_names_the_vllm_flags(capsys: pytest.CaptureFixture) -> None:
    import benchmark_latency
    import benchmark_throughput

    flags = ["--model", "--load-format", "--quantization-config", "--enforce-eager", "-tp",
             "--tensor-parallel-size", "--output-json", "--output-len", "--input-len"]  # fmt: skip
    for script, extra in ((benchmark_latency, ["--batch-size", "--batch-sizes", "--input-lens"]),
                          (benchmark_throughput, ["--num-prompts"])):  # fmt: skip
        with pytest.raises(SystemExit) as exit_info:
            script.main(["--help"])
        assert exit_info.value.code == 0
        text = capsys.readouterr().out
        for flag in flags + extra:
            assert flag in text, (script.__name__, flag)
    assert sys.modules["bench_utils"].DRY_RUN_MODEL == "kimi-k3-tiny"


def test_load_dry_run(tmp_path: Path) -> None:
    import benchmark_load

    out, folder = tmp_path / "load.json", tmp_path / "ckpt"
    assert benchmark_load.main(["--dry-run", "--out", str(folder), "--output-json", str(out)]) == 0
    record = json.loads(out.read_text())
    ckpt = record["checkpoint"]
    assert ckpt["num_experts"] == 4 and ckpt["shards"] > 1  # sharded, with its index
    for kind in ("cold", "warm"):
        assert record[kind]["bytes"] == ckpt["bytes"] and record[kind]["gb_per_s"] > 0
        assert record[kind]["peak_rss_bytes"] >= record[kind]["rss_before_load_bytes"] > 0
    assert not folder.exists()  # removed without --keep


def test_tp_greedy_dry_run(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """TP=2 (gloo, two worker processes) against TP=1 on kimi-k3-tiny: every greedy token equal."""
    import benchmark_tp_greedy

    out, runs = tmp_path / "tp.json", tmp_path / "runs"
    assert benchmark_tp_greedy.main(["--dry-run", "--tp-sizes", "1", "--runs-dir", str(runs)]) == 0
    assert not out.exists() and (runs / "tp1.json").exists()  # TP = 1 alone: kept, not compared
    argv = ["--dry-run", "--runs-dir", str(runs), "--output-json", str(out)]
    assert benchmark_tp_greedy.main(argv) == 0  # reuses tp1.json, runs TP = 2
    assert (runs / "tp2.json").exists()
    record = json.loads(out.read_text())
    assert set(record["runs"]) == {"1", "2"}
    comparison = record["comparisons"]["2"]
    assert comparison["prompts"] == 3 and comparison["identical"] == 3
    # Kept runs of other settings are not compared with: seed 5's prompts against seed 0's
    # tokens read as a TP divergence.
    with pytest.raises(SystemExit) as exit_info:
        benchmark_tp_greedy.main([*argv, "--seed", "5"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert (
        f"argument --runs-dir: {runs / 'tp1.json'} was made with other settings: seed 0 (now 5)"
        in err
    )


def test_tp_greedy_compare_reports_the_first_divergence_and_its_gap() -> None:
    import benchmark_tp_greedy

    base = {"tokens": [[1, 2, 3], [4, 5, 6]], "gaps": [[0.5, 0.01, 2.0], [1.0, 1.0, 1.0]]}
    other = {"tokens": [[1, 7, 3], [4, 5, 6]]}
    c = benchmark_tp_greedy.compare(base, other)
    assert (c["identical"], c["first_divergence_positions"]) == (1, [1])
    assert c["top_two_gap_at_divergence"] == [0.01]
    assert c["matching_tokens_fraction"] == (2 / 3 + 1) / 2


def test_host_overhead_with_a_tp_worker_replica(capsys: pytest.CaptureFixture) -> None:
    # A few decode steps of the stubbed tiny model, each also encoded, pickled, decoded and
    # executed by the worker replica (its decoder raises on a table change it cannot apply); the
    # decode steps' message stays small (changed tails only).
    import benchmark_host_overhead

    argv = ["--batch-sizes", "3", "--input-len", "40", "--steps", "3", "--warmup-steps", "1",
            "--tp-worker"]  # fmt: skip
    assert benchmark_host_overhead.main(argv) == 0
    lines = capsys.readouterr().out.splitlines()
    assert "worker ms" in lines[0] and "message KB" in lines[0]
    row = next(line.split() for line in lines[1:] if line.split()[:1] == ["3"])
    send_ms, worker_ms, message_kb = (float(v) for v in row[4:7])
    assert send_ms > 0 and worker_ms > 0 and 0 < message_kb < 4
