"""The engine benchmarks' flag checks as on a GPU host (torch.cuda.is_available faked; the run
stops where the measuring would start): every bad value is a parser error naming its flag
(exit 2), never a traceback, and every documented value is accepted."""

import importlib
import math
import os
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


class Reached(Exception):
    """The checks passed: the script went on to measure."""


@pytest.fixture(autouse=True)
def gpu_host(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)


def run(name: str, argv: list[str], monkeypatch: pytest.MonkeyPatch) -> None:
    module = importlib.import_module(name)

    def reached(device: torch.device) -> None:
        raise Reached

    monkeypatch.setattr(module, "environment", reached)  # the first step after the checks
    module.main(argv)


@pytest.mark.parametrize(
    "name, argv",
    [
        ("benchmark_latency", ["--max-model-len", "auto"]),
        ("benchmark_latency", ["--max-model-len", "-1"]),
        ("benchmark_latency", ["--max-model-len", "2k", "--batch-sizes", "1", "4"]),
        ("benchmark_throughput", ["--max-model-len", "auto"]),
        ("benchmark_throughput", ["--max-model-len", "2K"]),
        ("benchmark_throughput", ["-tp", "2", "--max-num-seqs", "8"]),
        # The dry run turns asynchronous scheduling on whatever the TP size (once refused at TP
        # 2 as "argument --async-scheduling", a flag not given).
        ("benchmark_latency", ["--dry-run", "-tp", "2"]),
    ],
)  # fmt: skip
def test_documented_values_pass_the_checks(name, argv, monkeypatch) -> None:
    with pytest.raises(Reached):
        run(name, argv, monkeypatch)


@pytest.mark.parametrize(
    "name, argv, notes",
    [
        ("benchmark_latency", ["--batch-sizes", "4", "--output-len", "2", "--model", "x"],
         "--model 'x' by 'kimi-k3-tiny', --batch-sizes [4] by [1, 2]"),
        ("benchmark_throughput", ["--num-prompts", "3", "--input-len", "100"],
         "--input-len 100 by 12"),
        # The singular flags, which the dry run's lists supersede.
        ("benchmark_latency", ["--batch-size", "4", "--input-len", "64"],
         "--batch-size 4 by 1, --input-len 64 by 8"),
        ("benchmark_latency", ["--async-scheduling"], None),
    ],
)  # fmt: skip
def test_dry_run_names_the_given_flags_it_replaces(name, argv, notes, monkeypatch, capsys) -> None:
    """Flags given with --dry-run that it replaces (batch sizes, model) were dropped without a
    word; one given at the dry run's own value (--output-len 2, --num-prompts 3) is not named."""
    with pytest.raises(Reached):
        run(name, ["--dry-run", *argv], monkeypatch)
    err = capsys.readouterr().err
    if notes is None:
        assert "--dry-run replaces" not in err, err
    else:
        assert f"--dry-run replaces {notes}\n" in err, err


@pytest.mark.parametrize(
    "name, argv, message",
    [
        ("benchmark_throughput", ["--max-model-len", "12q"],
         "argument --max-model-len: cannot parse '12q'"),
        ("benchmark_throughput", ["--max-model-len", "100"],
         "argument --max-model-len: 100 is too small, --input-len + --output-len need 1152"),
        ("benchmark_latency", ["--max-model-len", "100"], "argument --max-model-len: 100 is too"),
        ("benchmark_throughput", ["--input-len", "5000"],
         "--input-len + --output-len: 5128 tokens per sequence; max_model_len 5128 exceeds"),
        ("benchmark_latency", ["--input-len", "5000"], "(--input-len/--input-lens) + the sweep"),
        # 0 was taken for "unset" and replaced by the default.
        ("benchmark_throughput", ["--max-num-seqs", "0"], "argument --max-num-seqs: max_num_seqs"),
        ("benchmark_latency", ["--max-num-seqs", "0"], "argument --max-num-seqs: max_num_seqs"),
        # The decode case of batch 8 needs 8 sequences running together.
        ("benchmark_latency", ["--max-num-seqs", "4", "--batch-sizes", "1", "8"],
         "argument --max-num-seqs: 4 is below the largest batch size 8"),
        ("benchmark_latency", ["--time-budget-s", "0"],
         "argument --time-budget-s: must be a finite number > 0, got 0"),
        ("benchmark_latency", ["--time-budget-s", "-5"],
         "argument --time-budget-s: must be a finite number > 0, got -5"),
        ("benchmark_latency", ["--time-budget-s", "nan"],
         "argument --time-budget-s: must be a finite number > 0, got nan"),
        # Passed: written to the JSON record as `Infinity`, which is not JSON.
        ("benchmark_latency", ["--time-budget-s", "inf"],
         "argument --time-budget-s: must be a finite number > 0, got inf"),
        ("benchmark_latency", ["--copy-gib", "nan"],
         "argument --copy-gib: must be a finite number > 0, got nan"),
        # Passed, then an OverflowError traceback sizing the copy's buffer.
        ("benchmark_latency", ["--copy-gib", "inf"],
         "argument --copy-gib: must be a finite number > 0, got inf"),
        ("benchmark_latency", ["--copy-gib", "0.5"], "argument --copy-gib: must be at least 1"),
        ("benchmark_latency", ["-tp", "0"], "argument --tensor-parallel-size: tensor_parallel"),
        ("benchmark_throughput", ["-tp", "3"],
         "argument --tensor-parallel-size: 3 does not shard this model"),
        ("benchmark_latency", ["--block-size", "0"], "argument --block-size: block_size"),
        # Was one message for all of them, naming neither the flag at fault nor its value.
        ("benchmark_latency", ["--batch-sizes", "4", "0"],
         "argument --batch-sizes: must be >= 1, got 0"),
        ("benchmark_latency", ["--input-len", "0"], "argument --input-len: must be >= 1, got 0"),
        ("benchmark_latency", ["--output-len", "-2"],
         "argument --output-len: must be >= 1, got -2"),
        ("benchmark_latency", ["--matmul-size", "0"],
         "argument --matmul-size: must be >= 1, got 0"),
        ("benchmark_latency", ["--profile-steps", "-1"],
         "argument --profile-steps: must be >= 0, got -1"),
        ("benchmark_throughput", ["--num-prompts", "0"],
         "argument --num-prompts: must be >= 1, got 0"),
        ("benchmark_throughput", ["--input-len", "-1"],
         "argument --input-len: must be >= 1, got -1"),
        ("benchmark_throughput", ["--output-len", "x"],
         "argument --output-len: not an integer: 'x'"),
        # A value and its sweep: one of them was silently ignored.
        ("benchmark_latency", ["--batch-size", "4", "--batch-sizes", "1", "8"],
         "argument --batch-sizes: not allowed with argument --batch-size"),
        ("benchmark_latency", ["--input-len", "64", "--input-lens", "128"],
         "argument --input-lens: not allowed with argument --input-len"),
        # tp_greedy runs each of --tp-sizes: a -tp was ignored.
        ("benchmark_tp_greedy", ["-tp", "2"], "argument -tp/--tensor-parallel-size: this script"),
    ],
)  # fmt: skip
def test_bad_values_are_refused_by_flag(name, argv, message, monkeypatch, capsys) -> None:
    with pytest.raises(SystemExit) as exit_info:
        run(name, argv, monkeypatch)
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


@pytest.mark.parametrize("name", ["benchmark_throughput", "benchmark_latency"])
def test_every_engine_refusal_is_named_with_the_workloads(name, monkeypatch, capsys) -> None:
    """The engine's refusals all come in one run, the workload's own length among them (named as
    the workload's, as when it comes alone). The latency sweep built a config to learn its step
    budget before it knew its length: that build's refusals came alone."""
    with pytest.raises(SystemExit) as exit_info:
        run(
            name,
            ["--input-len", "5000", "--kv-cache-dtype", "fp8", "--revision", "v2"],
            monkeypatch,
        )
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    lines = err.splitlines()
    assert lines[-4].endswith("error: 3 arguments refused:"), err
    assert lines[-3].startswith("  argument --revision: revision 'v2' cannot"), err
    assert lines[-2].startswith("  argument --kv-cache-dtype: kv_cache_dtype 'fp8'"), err
    assert " tokens per sequence; max_model_len " in lines[-1], err
    assert "exceeds the model's max_position_embeddings 4096" in lines[-1], err


def test_a_refused_step_budget_is_named_by_the_engine_with_the_others(monkeypatch, capsys) -> None:
    """The latency sweep sizes its lengths by the step's token budget before the engine config is
    built: a negative --max-num-batched-tokens was judged there as a budget ("must exceed the
    largest batch"), alone, and the engine's refusals (of it, of --revision) never came."""
    with pytest.raises(SystemExit) as exit_info:
        argv = ["--max-num-batched-tokens", "-5", "--revision", "v2"]
        run("benchmark_latency", argv, monkeypatch)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "error: 2 arguments refused:" in err, err
    assert "argument --max-num-batched-tokens: max_num_batched_tokens must be >= 1, got -5" in err
    assert "argument --revision: revision 'v2' cannot" in err, err


@pytest.mark.parametrize("blocks, slots, ok", [(64, 4, True), (63, 4, False), (64, 3, False)])
def test_latency_refuses_a_cache_that_cannot_hold_the_largest_batch(
    blocks: int, slots: int, ok: bool, capsys: pytest.CaptureFixture
) -> None:
    """4 sequences of up to 250 tokens in blocks of 16: 4 x 16 blocks and 4 KDA slots."""
    import benchmark_latency

    kv = SimpleNamespace(block_size=16, initial_num_free_blocks=blocks,
                         initial_num_free_kda_slots=slots)  # fmt: skip
    shut = []
    engine = SimpleNamespace(kv_cache_manager=kv, shutdown=lambda: shut.append(True))
    parser = benchmark_latency.make_parser("")
    if ok:
        benchmark_latency.check_cache_holds(parser, engine, 4, 250)
        assert not shut
        return
    with pytest.raises(SystemExit) as exit_info:
        benchmark_latency.check_cache_holds(parser, engine, 4, 250)
    assert exit_info.value.code == 2 and shut == [True]
    err = capsys.readouterr().err
    assert "the cache arguments: the sweep runs 4 sequences of up to 250 tokens" in err
    assert f"{4 * math.ceil(250 / 16)} MLA blocks" in err


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--tp-sizes", "1", "3"], "argument --tp-sizes: 3 does not shard this model"),
        (["--tp-sizes", "1", "0"], "argument --tp-sizes: must be >= 1, got 0"),
        (["--tp-sizes", "-1"], "argument --tp-sizes: must be >= 1, got -1"),  # was "include 1"
        # Exited 0 having thrown the tokens away.
        (["--tp-sizes", "1"], "argument --tp-sizes: 1 alone compares nothing"),
        # The dry run's own skip_tokenizer_init had refused it ("exclude each other").
        (["--tokenizer", "x", "--tp-sizes", "1", "3"], "argument --tp-sizes: 3 does not shard"),
        (["--runs-dir", "/proc/no-such-folder"], "argument --runs-dir: cannot create"),
        # The user's own --max-model-len at fault, not the workload.
        (["--max-model-len", "100000"], "argument --max-model-len: max_model_len 100000 exceeds"),
    ],
)
def test_tp_greedy_refuses_before_any_run(argv, message, monkeypatch, capsys) -> None:
    """Checked in the parent, before the TP = 1 child runs (rather than that child's minutes,
    then the failing child's traceback and a CalledProcessError)."""
    import benchmark_tp_greedy

    def no_child(*args, **kwargs):
        raise AssertionError("a child process was started")

    monkeypatch.setattr(benchmark_tp_greedy.subprocess, "run", no_child)
    with pytest.raises(SystemExit) as exit_info:
        benchmark_tp_greedy.main(["--dry-run", *argv])
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


def test_tp_greedy_checks_each_tp_size_once(monkeypatch, vllm_records) -> None:
    """One engine config per TP size before the runs (two, and their warnings, were built)."""
    import benchmark_tp_greedy

    def started(*args, **kwargs):
        raise Reached

    monkeypatch.setattr(benchmark_tp_greedy.subprocess, "run", started)
    with pytest.raises(Reached):
        benchmark_tp_greedy.main(["--dry-run", "--tp-sizes", "1", "2", "--enable-prefix-caching"])
    said = [r for r in vllm_records if "enable_prefix_caching has no effect" in r.getMessage()]
    assert len(said) == 2, [r.getMessage() for r in vllm_records]


def test_load_refuses_an_out_folder_it_did_not_write(tmp_path: Path, capsys) -> None:
    """--out is replaced and deleted afterwards: a folder of anything else (a real checkpoint
    given by mistake) was deleted with it."""
    import benchmark_load

    precious = tmp_path / "checkpoint"
    precious.mkdir()
    (precious / "model.safetensors").write_text("weights")
    a_file = tmp_path / "a-file"
    a_file.write_text("x")
    for out, message in ((precious, "is not empty and was not written by this script"),
                         (a_file, "exists and is not a folder")):  # fmt: skip
        with pytest.raises(SystemExit) as exit_info:
            benchmark_load.main(["--dry-run", "--out", str(out)])
        assert exit_info.value.code == 2
        assert f"argument --out: '{out}' {message}" in capsys.readouterr().err
    assert (precious / "model.safetensors").read_text() == "weights"
    assert a_file.read_text() == "x"


def test_load_refuses_an_out_it_cannot_create(tmp_path: Path, capsys) -> None:
    """A traceback (NotADirectoryError) where a parent is a file; missing parents were made and
    left behind, empty, when --out was deleted."""
    import benchmark_load

    (tmp_path / "a-file").write_text("x")
    for out, folder in ((tmp_path / "a-file" / "ckpt", tmp_path / "a-file"),
                        (tmp_path / "new" / "ckpt", tmp_path / "new")):  # fmt: skip
        with pytest.raises(SystemExit) as exit_info:
            benchmark_load.main(["--dry-run", "--out", str(out)])
        assert exit_info.value.code == 2
        assert f"argument --out: the folder '{folder}' does not exist" in capsys.readouterr().err
    assert not (tmp_path / "new").exists()


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--device", "cuda"], "argument --device: torch sees no GPU"),
        # A folder without config.json: a FileNotFoundError traceback.
        (["--model", "{tmp}"], "argument --model: {tmp}: no readable config.json"),
        (["--dtype", "int3"], "argument --dtype: invalid choice: 'int3'"),
        (["--model", "/nonexistent"], "argument --model: model '/nonexistent' is neither"),
        (["--model", "kimi-linear-tiny", "--num-experts", "1"],
         "argument --num-experts: config field 'num_experts_per_token': exceeds num_experts"),
        (["--model", "kimi-k3-tiny", "--num-experts", "3"],
         "argument --num-experts: kimi-k3-tiny's config has no num_experts to change"),
    ],
)  # fmt: skip
def test_load_refuses_bad_values_by_flag(argv, message, tmp_path, monkeypatch, capsys) -> None:
    """Each was a traceback (from the parent, or from the child process that loads); --out is
    left behind by none of them."""
    import benchmark_load

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    out = tmp_path / "ckpt"
    folder = tmp_path / "no-config"
    folder.mkdir()
    argv = [a.format(tmp=folder) for a in argv]
    with pytest.raises(SystemExit) as exit_info:
        benchmark_load.main(["--out", str(out), "--device", "cpu", *argv])
    assert exit_info.value.code == 2
    assert message.format(tmp=folder) in capsys.readouterr().err
    assert not out.exists()


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--device", "cuda"], "argument --device: torch sees no GPU"),  # was a ValueError
        (["--warmup-steps", "-1"], "argument --warmup-steps: must be >= 0, got -1"),
    ],
)
def test_host_overhead_refuses_by_flag(argv, message, monkeypatch, capsys) -> None:
    import benchmark_host_overhead

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(SystemExit) as exit_info:
        benchmark_host_overhead.main(["--batch-sizes", "1", "--steps", "1", *argv])
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


@pytest.mark.parametrize(
    "name, sized",
    [
        ("benchmark_latency", {"max_num_seqs", "max_model_len", "kv_cache_memory"}),
        ("benchmark_throughput", {"max_num_seqs", "max_model_len", "kv_cache_memory"}),
        ("benchmark_tp_greedy", {"max_num_seqs", "max_model_len"}),
    ],
)
def test_help_gives_the_benchmark_defaults_not_the_engine_ones(name, sized, monkeypatch) -> None:
    """--help said `--max-num-seqs ... (default: 256)`, the engine's default, where the script
    sizes it for its workload."""
    module = importlib.import_module(name)
    parsers = []

    def recorded(*args, **kwargs):
        parsers.append(make_parser(*args, **kwargs))
        return parsers[-1]

    make_parser = module.make_parser
    monkeypatch.setattr(module, "make_parser", recorded)
    with pytest.raises(SystemExit):
        module.main(["--help"])
    helps = {a.dest: a.help for a in parsers[0]._actions}
    for dest in ("max_num_seqs", "max_model_len", "kv_cache_memory"):
        assert ("sized for the workload" in helps[dest]) == (dest in sized), (dest, helps[dest])
    assert "256" not in helps["max_num_seqs"]


def test_tp_greedy_honours_the_sizes_given() -> None:
    import benchmark_tp_greedy

    args = SimpleNamespace(max_model_len=None, max_num_seqs=None, num_prompts=64, input_len=256,
                           output_len=32)  # fmt: skip
    assert benchmark_tp_greedy.workload_sizes(args) == {"max_model_len": 288, "max_num_seqs": 64}
    args.max_model_len, args.max_num_seqs = "4k", 16  # were replaced by the two above
    assert benchmark_tp_greedy.workload_sizes(args) == {"max_model_len": "4k", "max_num_seqs": 16}


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--shard-gb", "nan"], "argument --shard-gb: must be a finite number > 0, got nan"),
        (["--shard-gb", "0"], "argument --shard-gb: must be a finite number > 0, got 0"),
        (["--num-experts", "-1"], "argument --num-experts: must be >= 0, got -1"),
    ],
)
def test_load_refuses_a_shard_size_that_is_not_a_size(argv, message, tmp_path, capsys) -> None:
    """`--shard-gb nan` passed the `<= 0` check (NaN compares false), and no shard ever filled:
    the whole checkpoint went into one; the checks now run as the flags are parsed."""
    import benchmark_load

    out = tmp_path / "ckpt"
    with pytest.raises(SystemExit) as exit_info:
        benchmark_load.main(["--dry-run", "--out", str(out), *argv])
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err
    assert not out.exists()


def test_engine_flags_take_upstreams_underscore_spellings() -> None:
    import benchmark_latency

    args = benchmark_latency.make_parser("").parse_args(
        ["--load_format", "dummy", "--max_num_batched_tokens=512"]
    )
    assert (args.load_format, args.max_num_batched_tokens) == ("dummy", 512)


def test_output_json_writes_what_json_cannot_as_text(tmp_path: Path) -> None:
    """A record's dtype (or any value json has no type for) is written as its text, not a
    TypeError after the run."""
    import json

    import bench_utils

    out = tmp_path / "out.json"
    bench_utils.write_json(str(out), {"dtype": torch.bfloat16})
    assert json.loads(out.read_text()) == {"dtype": "torch.bfloat16"}
    bench_utils.write_json(None, {"dtype": torch.bfloat16})  # no --output-json: nothing
    assert os.listdir(tmp_path) == ["out.json"]
