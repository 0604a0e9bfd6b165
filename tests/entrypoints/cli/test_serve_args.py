"""`vllm serve` flags: --help documents every flag, and each flag that cannot work is refused
before the model loads, by name and with the reason (argparse exit code 2)."""

import argparse
import dataclasses
import socket

import pytest
from safetensors.torch import save_file

from vllm.engine.arg_utils import EngineArgs
from vllm.entrypoints.cli import serve
from vllm.entrypoints.cli.main import main, make_parser
from vllm.entrypoints.openai import api_server
from vllm.model_executor.model_loader.builtin import resolve_model
from vllm.model_executor.model_loader.loader import dummy_tensors
from vllm.transformers_utils.configs import load_model_config

RECIPE_FLAGS = [
    "--served-model-name", "--host", "--port", "--trust-remote-code", "--tensor-parallel-size",
    "-tp", "--language-model-only", "--reasoning-parser", "--max-model-len", "--kv-cache-dtype",
    "--attention-config", "-ac", "--quantization-config", "--speculative-config", "-sc",
    "--load-format", "--max-num-seqs", "--max-num-batched-tokens", "--gpu-memory-utilization",
    "--enforce-eager", "--seed", "--dtype", "--api-key", "--enable-tokenizer-info-endpoint",
    "--uvicorn-log-level",
]  # fmt: skip


@pytest.fixture(autouse=True)
def no_serving(monkeypatch: pytest.MonkeyPatch) -> None:
    """`main(["serve", ...])` runs in this process: a refusal that broke would go on to serve
    until killed, and the test would hang instead of failing. Serving fails the test instead."""

    def serve(*args, **kwargs) -> None:
        raise AssertionError("vllm serve started serving: the flags under test were accepted")

    monkeypatch.setattr(api_server._Server, "run", serve)


def test_help_lists_every_flag_with_text(capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["serve", "--help"])
    assert exit_info.value.code == 0
    text = capsys.readouterr().out
    for flag in RECIPE_FLAGS:
        assert flag in text, flag
    for field in dataclasses.fields(EngineArgs):
        assert "--" + field.name.replace("_", "-") in text, field.name
    serve = make_parser()._subparsers._group_actions[0].choices["serve"]
    for action in serve._actions:
        assert action.help, action.option_strings
    helps = {name: action.help for action in serve._actions for name in action.option_strings}
    assert "32k" in helps["--max-model-len"] and "auto" in helps["--max-model-len"]
    assert "fp8" in helps["--kv-cache-dtype"]
    assert helps["--max-num-seqs"].endswith("(default: 256)")
    # The value is named after upstream's flag, which comes first.
    assert "--kv-cache-memory-bytes KV_CACHE_MEMORY_BYTES, --kv-cache-memory" in text


@pytest.mark.parametrize(
    "value, expected",
    [
        ("1500", 1500),
        ("2k", 2000),
        ("2K", 2048),
        ("0.5k", 500),
        ("2.01k", 2010),
        ("1.001k", 1001),
        ("auto", 4096),
        ("-1", 4096),
    ],
)
def test_max_model_len_suffixes_and_auto(value: str, expected: int) -> None:
    """k = 1000s, K = 1024s; auto and -1 take kimi-k3-tiny's max_position_embeddings (4096)."""
    args = make_parser().parse_args(["serve", "kimi-k3-tiny", "--max-model-len", value])
    config = EngineArgs.from_cli_args(args).create_engine_config()
    assert config.model_config.max_model_len == expected
    assert config.scheduler_config.max_model_len == expected


@pytest.mark.parametrize(
    "argv, expected",
    [
        (["--kv-cache-memory-bytes", "8G"], 8 << 30),  # upstream's flag: K/M/G/T are 1024s
        (["--kv-cache-memory-bytes", "1.5g"], 1_500_000_000),  # k/m/g/t 1000s, decimals too
        (["--kv-cache-memory-bytes", "64K"], 64 << 10),
        (["--kv-cache-memory-bytes", "2t"], 2 * 10**12),
        (["--kv-cache-memory-bytes", "123456"], 123456),
        (["--kv_cache_memory_bytes=1M"], 1 << 20),
        (["--kv-cache-memory", "1048576"], 1 << 20),  # this fork's name, documented before
        (["--kv-cache-memory", "3M"], 3 << 20),
    ],
)
def test_kv_cache_memory_bytes_takes_upstreams_name_and_sizes(
    argv: list[str], expected: int
) -> None:
    """Upstream's `--kv-cache-memory-bytes` (the bytes of each GPU's KV cache), read as its
    `human_readable_int` reads it; `--kv-cache-memory`, this fork's name, is the same flag."""
    args = make_parser().parse_args(["serve", "kimi-k3-tiny", *argv])
    assert args.kv_cache_memory == expected
    config = EngineArgs.from_cli_args(args).create_engine_config()
    assert config.cache_config.kv_cache_memory == expected


@pytest.mark.parametrize(
    "value, words",
    [
        ("8GiB", ["'8GiB'", "8G"]),  # upstream refuses it too
        ("1.5G", ["decimals", "1.5g"]),  # as upstream: 1024s only in whole numbers
        ("1.5", ["'1.5'"]),
        ("lots", ["'lots'"]),
        ("0", [">= 1, got 0"]),
    ],
)
def test_bad_kv_cache_memory_bytes_are_refused_by_name(
    value: str, words: list[str], capsys: pytest.CaptureFixture
) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["serve", "kimi-k3-tiny", "--host", "127.0.0.1", "--port", "0",
              "--kv-cache-memory-bytes", value])  # fmt: skip
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "argument --kv-cache-memory-bytes" in err, err
    for word in words:
        assert word in err, err


def test_recipe_flags_parse() -> None:
    args = make_parser().parse_args(
        ["serve", "kimi-k3-tiny", "--served-model-name", "a", "b", "-tp", "2",
         "--trust-remote-code", "--language-model-only", "--reasoning-parser", "kimi_k3",
         "--max-model-len", "2k", "-ac", '{"mla_prefill_backend": "TRITON_MLA"}',
         "--quantization-config", '{"linear":"fp8_per_channel"}']
    )  # fmt: skip
    assert args.served_model_name == ["a", "b"]
    assert args.tensor_parallel_size == 2 and args.trust_remote_code
    assert args.reasoning_parser == "kimi_k3" and args.max_model_len == "2k"
    assert args.enable_tokenizer_info_endpoint  # on by default
    # CORS as vLLM: any origin, method and header, no credentials, unless told otherwise.
    assert args.allowed_origins == args.allowed_methods == args.allowed_headers == ["*"]
    assert not args.allow_credentials
    args = make_parser().parse_args(
        ["serve", "kimi-k3-tiny", "--allowed-origins", '["https://ui.example"]',
         "--allowed-methods", '["GET", "POST"]', "--allow-credentials"]
    )  # fmt: skip
    assert args.allowed_origins == ["https://ui.example"]
    assert args.allowed_methods == ["GET", "POST"] and args.allow_credentials


@pytest.mark.parametrize(
    "argv, names",
    [
        (["-sc", '{"method": "dspark", "num_speculative_tokens": 2}'],
         ["--speculative-config", "not implemented"]),
        (["-ac", "{not json"], ["--attention-config", "JSON"]),
        (["-ac", "[1]"], ["--attention-config", "object"]),
        (["--kv-cache-dtype", "fp8"], ["--kv-cache-dtype", "not supported"]),
        # Upstream's --quantization / -q: it was taken as an abbreviation of
        # --quantization-config, whose error (fp8 "is not valid JSON") named the wrong flag.
        (["--quantization", "fp8"], ["argument --quantization/-q:", "--quantization-config"]),
        (["-q", "fp8"], ["argument --quantization/-q:", "('fp8') are not supported"]),
        (["--max-model-len", "12q"], ["--max-model-len", "cannot parse"]),
        (["--generation-config", "/no/such/folder"], ["--generation-config", "does not exist"]),
        (["--max-model-len", "1m"], ["--max-model-len", "max_position_embeddings"]),
        (["--quantization-config", "{oops"], ["--quantization-config", "not valid JSON"]),
        (["--load-format", "pt"], ["--load-format"]),
        (["--gpu-memory-utilization", "1.5"], ["--gpu-memory-utilization"]),
        (["--reasoning-parser", "deepseek"], ["--reasoning-parser", "invalid choice"]),
        (["--dtype", "int3"], ["--dtype"]),
        (["--port", "70000"], ["--port"]),
        (["--port", "-1"], ["--port", "0: one the OS picks"]),
        (["--skip-tokenizer-init"], ["--skip-tokenizer-init", "needs a"]),
        (["--revision", "0123abc"],
         ["argument --revision: revision '0123abc' cannot be honoured", "downloads nothing"]),
        (["--tokenizer-mode", "mistral"],
         ["argument --tokenizer-mode: tokenizer_mode 'mistral' is not", "mistral_common"]),
        (["--no-enable-chunked-prefill"],
         ["argument --enable-chunked-prefill: turning it off is not supported", "always splits"]),
        (["--api-key", ""], ["--api-key", "must not be empty"]),
        (["--max-request-body-bytes", "0"], ["--max-request-body-bytes", "at least 1"]),
        (["--max-log-len", "-1"], ["--max-log-len", "must be >= 0"]),
        (["--allowed-origins", "https://ui.example"], ["--allowed-origins", "not valid JSON"]),
        (["--allowed-methods", '"GET"'], ["--allowed-methods", "a JSON list of strings"]),
        (["--allowed-headers", "[1]"], ["--allowed-headers", "a JSON list of strings"]),
        # Words of the user's JSON (seed, device) are not the flag at fault.
        (["--quantization-config", '{"linear": {"seed": 1}}'],
         ["argument --quantization-config:", "unknown keys"]),
        (["--quantization-config", '{"linear": "fp4"}'], ["argument --quantization-config:"]),
        (["--quantization-config", '{"linear": "fp8_per_token"}'],
         ["argument --quantization-config:", "no online method for 'fp8_per_token'"]),
        (["--quantization-config", "[1, 2]"], ["argument --quantization-config:", "object"]),
        (["--quantization-config", "{}"], ["argument --quantization-config:", "'linear' must"]),
        (["--quantization-config", '{"linear": "fp8_per_channel", "ignore": ["re:.*q_a_proj$"]}'],
         ["argument --quantization-config:", "split the fused layer"]),
        (["-tp", "5"], ["argument --tensor-parallel-size: 5 does not shard this model:",
                        "KDA heads do not split over TP 5"]),
        (["--host", "127.0.0.1", "--port", "0", "--num-gpu-blocks-override", "1"],
         ["the cache arguments:", "cannot hold one sequence",
          # The override fixes the block count: max_num_seqs and memory do not change it.
          "raise num_gpu_blocks_override to at least 256"]),
        (["--max-num-seqs", "1", "--kv-cache-memory", "5600K"],
         ["the cache arguments:", "cannot hold one sequence", "or max_num_seqs"]),
        # More than the device holds: the allocator's refusal (was a traceback, exit 1).
        (["--max-num-seqs", "1", "--num-gpu-blocks-override", "1000000000000"],
         ["the cache arguments:", "1000000000000 cache blocks and 1 KDA slots do not fit on cpu"]),
    ],
)  # fmt: skip
def test_bad_flags_are_refused_by_name(
    argv: list[str], names: list[str], capsys: pytest.CaptureFixture
) -> None:
    with pytest.raises(SystemExit) as exit_info:
        # On loopback and a port the OS picks, should a refusal break (a case's own --host or
        # --port comes later, and wins).
        main(["serve", "kimi-k3-tiny", "--host", "127.0.0.1", "--port", "0", *argv])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    for name in names:
        assert name in err, err


@pytest.mark.parametrize(
    "kernel,reason",
    [
        ("NoSuchKernel", "'NoSuchKernel' is not one of"),
        # Forced, but unable to run a layer: the layer and the kernel's own reason are named.
        ("AiterPerTokenFp8ScaledMMLinearKernel",
         "cannot run language_model.model.layers.0.self_attn.o_proj (N=512, K=1536"),
    ],
)  # fmt: skip
def test_bad_kernel_override_is_refused_by_its_variable(
    kernel: str, reason: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    """The environment variable is at fault, not `--model` (which the error used to name)."""
    monkeypatch.setenv("VLLM_FP8_LINEAR_KERNEL", kernel)
    recipe = '{"linear":"fp8_per_channel","ignore":["re:(?!.*self_attn\\\\.o_proj$).*"]}'
    with pytest.raises(SystemExit) as exit_info:
        main(["serve", "kimi-k3-tiny", "--host", "127.0.0.1", "--port", "0",
              "--quantization-config", recipe])  # fmt: skip
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert f"error: environment variable VLLM_FP8_LINEAR_KERNEL={kernel!r}" in err, err
    assert reason in err and "--model" not in err.splitlines()[-1], err


@pytest.mark.parametrize(
    "variable",
    ["VLLM_KIMI_K3_FUSED_OPROJ_EPILOGUE", "VLLM_KDA_PREFILL_GRAPHS", "VLLM_TRITON_PDL",
     "VLLM_KIMI_FUSE_SHARED_EXPERTS", "VLLM_ROCM_USE_AITER"],
)  # fmt: skip
def test_a_bad_switch_is_refused_at_start_up(
    variable: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    """Each is read where its code path runs: the fused epilogue's in every KDA forward, so a
    typo passed start-up on the CPU and the first request stopped the engine (503 for every
    client); PDL's and the prefill graphs' only on a GPU. The engine checks them all first."""
    monkeypatch.setenv(variable, "yes")
    with pytest.raises(SystemExit) as exit_info:
        main(["serve", "kimi-k3-tiny", "--host", "127.0.0.1", "--port", "0"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert f"error: environment variable {variable}='yes': expected 1 or 0" in err, err


def test_every_refusal_of_a_recipe_is_reported_in_one_run(capsys: pytest.CaptureFixture) -> None:
    """The PR's recipe has a server flag and engine flags that this fork refuses; all are named
    in one run (the first alone was, so the user learned of the next only after fixing it), along
    with a bad server value found by the same checks. The engine's own refusals were cut at its
    first (--revision here) until it checked every independent argument."""
    recipe = '{"linear":"fp8_per_channel","ignore":["re:(?!.*self_attn\\\\.o_proj$).*"]}'
    with pytest.raises(SystemExit) as exit_info:
        main(["serve", "kimi-k3-tiny", "--host", "127.0.0.1", "--port", "0",
              "--kv-cache-dtype", "fp8", "-ac", "[1]", "--quantization-config", recipe,
              "--speculative-config", '{"method": "dspark"}', "--revision", "v2",
              "--max-num-seqs", "0"])  # fmt: skip
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    lines = err.splitlines()
    assert "error: 5 arguments refused:" in lines[-6], err
    assert lines[-5].startswith("  argument --speculative-config/-sc: speculative decoding"), err
    assert lines[-4] == "  argument --attention-config/-ac: must be a JSON object", err
    assert lines[-3].startswith("  argument --revision: revision 'v2' cannot be honoured"), err
    assert lines[-2] == "  argument --max-num-seqs: max_num_seqs must be >= 1, got 0", err
    assert lines[-1].startswith("  argument --kv-cache-dtype: kv_cache_dtype 'fp8' is not"), err


def test_refusals_of_the_engine_and_its_environment_come_together(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    """Each bad environment variable, each bad engine flag; a check that needs a refused value
    is skipped (no model config: no limit for --max-model-len to exceed), one that does not
    still runs (--max-model-len's own spelling)."""
    monkeypatch.setenv("VLLM_TRITON_PDL", "yes")
    monkeypatch.setenv("VLLM_KDA_PREFILL_GRAPHS", "no")
    with pytest.raises(SystemExit) as exit_info:
        main(["serve", "no-such-model", "--host", "127.0.0.1", "--port", "0", "--max-model-len",
              "12q", "--load-format", "pt", "--gpu-memory-utilization", "2"])  # fmt: skip
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    refused = err[err.index("arguments refused:") :].splitlines()[1:]
    assert [line.split(":")[0].strip() for line in refused] == [
        "environment variable VLLM_KDA_PREFILL_GRAPHS='no'",
        "environment variable VLLM_TRITON_PDL='yes'",
        "argument --gpu-memory-utilization",
        "argument --load-format",
        "argument --max-model-len",
        "argument --model",
    ], err
    assert "cannot parse '12q'" in err and "'no-such-model' is neither a folder" in err, err
    monkeypatch.delenv("VLLM_TRITON_PDL")
    monkeypatch.delenv("VLLM_KDA_PREFILL_GRAPHS")
    with pytest.raises(SystemExit):
        main(["serve", "no-such-model", "--port", "0", "--max-model-len", "1m"])
    err = capsys.readouterr().err
    assert "arguments refused" not in err and "--max-model-len" not in err.splitlines()[-1], err


def test_model_given_twice_must_agree(capsys: pytest.CaptureFixture) -> None:
    """MODEL silently replaced a different --model."""
    with pytest.raises(SystemExit) as exit_info:
        main(["serve", "kimi-linear-tiny", "--model", "other", "--port", "0"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "argument --model: 'other' differs from MODEL 'kimi-linear-tiny'" in err, err


@pytest.mark.parametrize(
    "argv",
    [["kimi-linear-tiny"], ["--model", "kimi-linear-tiny"],
     ["kimi-linear-tiny", "--model", "kimi-linear-tiny"], []],
)  # fmt: skip
def test_model_from_either_spelling(argv: list[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """The model that reaches the engine (stopped there: this test loads nothing)."""
    seen = []

    def stop(args: argparse.Namespace, config: object) -> None:
        seen.append(args.model)

    monkeypatch.setattr(api_server, "run_server", stop)
    main(["serve", *argv, "--port", "0"])
    assert seen == ["kimi-linear-tiny" if argv else EngineArgs.model]


@pytest.mark.parametrize(
    "argv, loggers, max_log_len",
    [
        ([], ["LoggingStatLogger"], None),
        (["--disable-log-stats", "--enable-log-requests", "--max-log-len", "5"], [], 5),
    ],
)
def test_log_flags_reach_the_server(
    argv: list[str], loggers: list[str], max_log_len: int | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Upstream's --disable-log-stats, --enable-log-requests and --max-log-len, as the server is
    built (stopped there, as Ctrl-C would: the request log's lines are tested on a real server,
    test_serve_kimi_k3_tiny.py)."""
    seen = []

    def stop(engine, *args, request_logger=None, **kwargs):
        seen.append(([type(x).__name__ for x in engine.stat_loggers], request_logger))
        raise KeyboardInterrupt

    monkeypatch.setattr(api_server, "build_app", stop)
    main(["serve", "kimi-k3-tiny", "--host", "127.0.0.1", "--port", "0", *argv])
    ((stats, request_logger),) = seen
    assert stats == loggers
    if argv:
        assert request_logger.max_log_len == max_log_len
    else:
        assert request_logger is None


@pytest.mark.parametrize("argv, enabled", [([], False), (["--enable-prompt-tokens-details"], True)])
def test_enable_prompt_tokens_details_reaches_the_server(
    argv: list[str], enabled: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """vLLM's flag, off by default, as the server is built (stopped there, as Ctrl-C would; the
    replies it changes are tested on a server, test_server_fake_engine.py)."""
    seen = []

    def stop(*args, enable_prompt_tokens_details=None, **kwargs):
        seen.append(enable_prompt_tokens_details)
        raise KeyboardInterrupt

    monkeypatch.setattr(api_server, "build_app", stop)
    main(["serve", "kimi-k3-tiny", "--host", "127.0.0.1", "--port", "0", *argv])
    assert seen == [enabled]


@pytest.mark.parametrize(
    "argv, expected",
    [
        (["--enable-prefix-caching"], dict(enable_prefix_caching=True)),
        (["--no-enable-prefix-caching"], dict(enable_prefix_caching=False)),
        (["--enable-chunked-prefill"], dict(enable_chunked_prefill=True)),
        (["--disable-custom-all-reduce", "-tp", "2"], dict(disable_custom_all_reduce=True)),
        (["--tokenizer-mode", "auto"], dict(tokenizer_mode="auto")),
        ([], dict(enable_prefix_caching=None, enable_chunked_prefill=None)),
    ],
)
def test_upstream_flags_that_change_nothing_here_are_taken(
    argv: list[str], expected: dict, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Upstream's engine flags whose effect is what this engine does anyway get past every
    check to the server (stopped there: this test loads nothing); they were unrecognized."""
    seen = []

    def stop(args: argparse.Namespace, config: object) -> None:
        seen.append(EngineArgs.from_cli_args(args))

    monkeypatch.setattr(api_server, "run_server", stop)
    main(["serve", "kimi-k3-tiny", "--port", "0", *argv])
    (engine_args,) = seen
    for name, value in expected.items():
        assert getattr(engine_args, name) == value, name


def test_disable_log_stats_is_the_engine_field() -> None:
    """One definition: `--disable-log-stats` is `EngineArgs.disable_log_stats` (`LLM`'s keyword
    too, as upstream), listed with the engine flags, not a flag of the server's own."""
    parser = make_parser()
    serve_parser = parser._subparsers._group_actions[0].choices["serve"]
    (engine,) = [g for g in serve_parser._action_groups if g.title.startswith("engine")]
    flags = [a for a in serve_parser._actions if "--disable-log-stats" in a.option_strings]
    assert len(flags) == 1 and flags[0] in engine._group_actions
    for argv, disabled in (([], False), (["--disable-log-stats"], True)):
        args = parser.parse_args(["serve", "kimi-k3-tiny", *argv])
        assert EngineArgs.from_cli_args(args).disable_log_stats is disabled


def test_model_and_model_tag_agree_across_spellings_of_one_folder() -> None:
    assert serve._same_model("./ckpt/", "ckpt") and serve._same_model("a/../b", "b")
    assert not serve._same_model("ckpt", "ckpt2")


def test_busy_port_is_refused_before_loading(capsys: pytest.CaptureFixture) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen(1)
        port = busy.getsockname()[1]
        with pytest.raises(SystemExit) as exit_info:
            main(["serve", "kimi-k3-tiny", "--host", "127.0.0.1", "--port", str(port)])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "--host/--port" in err and str(port) in err


def test_a_model_config_that_is_not_an_object_names_the_model(tmp_path, capsys) -> None:
    (tmp_path / "config.json").write_text("[]")
    with pytest.raises(SystemExit) as exit_info:
        main(["serve", str(tmp_path), "--host", "127.0.0.1", "--port", "0"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "argument --model: model config" in err and "must be a JSON object" in err, err


def test_a_model_folder_without_weights_is_refused_before_loading(tmp_path, capsys) -> None:
    """It stopped the server with a traceback (exit 1) once loading had begun."""
    for name in ("config.json", "tokenizer.json", "tokenizer_config.json"):
        file = resolve_model("kimi-linear-tiny")[0] / name
        (tmp_path / name).write_bytes(file.read_bytes())
    with pytest.raises(SystemExit) as exit_info:
        main(["serve", str(tmp_path), "--host", "127.0.0.1", "--port", "0"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "argument --load-format: load_format 'auto': no safetensors checkpoint" in err, err
    assert "--load-format dummy" in err, err
    # PyTorch's pickle files are named as such (this fork reads safetensors only); a training
    # run's other pickles are not weights and not named.
    for name in ("training_args.bin", "optimizer.pt", "rng_state_0.pth"):
        (tmp_path / name).write_bytes(b"")
    with pytest.raises(SystemExit):
        main(["serve", str(tmp_path), "--host", "127.0.0.1", "--port", "0"])
    assert "pickle" not in capsys.readouterr().err
    for name in ("pytorch_model.bin", "consolidated.00.pth"):
        (tmp_path / name).write_bytes(b"")
    with pytest.raises(SystemExit):
        main(["serve", str(tmp_path), "--host", "127.0.0.1", "--port", "0"])
    err = capsys.readouterr().err
    assert (
        "only PyTorch pickle files (consolidated.00.pth, pytorch_model.bin), which are not "
        "supported"
    ) in err, err


@pytest.mark.parametrize(
    "broken, said",
    [
        (
            "model.norm.weight",
            "checkpoint tensor 'model.norm.weight' (in {folder}/model.safetensors): ",
        ),
        ("tokenizer.json", "the tokenizer: {folder}/tokenizer.json: not a tokenizer"),
    ],
)
def test_a_checkpoint_that_cannot_load_exits_2(tmp_path, capsys, broken: str, said: str) -> None:
    """Found while loading (a tensor of the wrong shape, a corrupt tokenizer): a traceback and
    exit 1 before."""
    folder = resolve_model("kimi-linear-tiny")[0]
    for name in ("config.json", "tokenizer.json", "tokenizer_config.json"):
        (tmp_path / name).write_bytes((folder / name).read_bytes())
    tensors = dict(dummy_tensors(load_model_config(folder), seed=0))
    if broken == "tokenizer.json":
        (tmp_path / broken).write_text('{"a" 1}')
    else:
        tensors[broken] = tensors[broken][:3]
    save_file({k: v.contiguous() for k, v in tensors.items()}, tmp_path / "model.safetensors")
    with pytest.raises(SystemExit) as exit_info:
        main(["serve", str(tmp_path), "--host", "127.0.0.1", "--port", "0", "--max-num-seqs", "2"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert f"error: loading {tmp_path}: {said.format(folder=tmp_path)}" in err, err
    assert "Traceback" not in err


def test_an_index_listing_missing_shards_blames_the_model(tmp_path, capsys) -> None:
    """It blamed --load-format (whose 'dummy' is no cure for a broken checkpoint)."""
    folder = resolve_model("kimi-linear-tiny")[0]
    for name in ("config.json", "tokenizer.json", "tokenizer_config.json"):
        (tmp_path / name).write_bytes((folder / name).read_bytes())
    index = tmp_path / "model.safetensors.index.json"
    index.write_text('{"weight_map": {"model.norm.weight": "model-00001-of-00002.safetensors"}}')
    with pytest.raises(SystemExit) as exit_info:
        main(["serve", str(tmp_path), "--host", "127.0.0.1", "--port", "0"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    expected = f"argument --model: {index} lists shards that do not exist: ['model-00001-of-00002"
    assert expected in err, err


def test_help_states_what_each_unset_default_resolves_to() -> None:
    """The fields whose default is None said nothing (--max-model-len) or a bare number that is
    not always the value (--max-num-batched-tokens: max(8192, max_num_seqs)); checked against
    what the config resolves."""
    serve = make_parser()._subparsers._group_actions[0].choices["serve"]
    helps = {name: action.help for action in serve._actions for name in action.option_strings}
    assert "(default: auto, the model's max_position_embeddings)" in helps["--max-model-len"]
    assert "(default: 8192, or max_num_seqs if larger)" in helps["--max-num-batched-tokens"]
    assert "(default: 512, at most max_num_seqs)" in helps["--max-cudagraph-capture-size"]
    assert helps["--uvicorn-log-level"].endswith("(default: info)")
    assert helps["--max-request-body-bytes"].endswith("(default: 33554432, 32 MiB)")
    config = EngineArgs(skip_tokenizer_init=True).create_engine_config()
    assert config.model_config.max_model_len == 4096  # kimi-k3-tiny's max_position_embeddings
    assert config.scheduler_config.max_num_batched_tokens == 8192
    big = EngineArgs(skip_tokenizer_init=True, max_num_seqs=9000).create_engine_config()
    assert big.scheduler_config.max_num_batched_tokens == 9000


def test_underscore_spellings_of_long_flags_are_read_as_dashed() -> None:
    """As upstream's parser: `--max_model_len` is `--max-model-len`, in either form, while
    values (a JSON with underscores, a name) stay as they are."""
    recipe = '{"linear":"fp8_per_channel","ignore":["re:.*gate_proj$"]}'
    args = make_parser().parse_args(
        ["serve", "kimi-k3-tiny", "--max_model_len", "100", "--max_num_seqs=3",
         "--quantization_config", recipe, "--served_model_name", "a_b"]
    )  # fmt: skip
    assert (args.max_model_len, args.max_num_seqs) == ("100", 3)  # suffixes are read later
    assert args.quantization_config == recipe
    assert args.served_model_name == ["a_b"]


def test_vllm_alone_prints_its_help_and_succeeds(capsys) -> None:
    """As upstream: `vllm` with no subcommand shows the commands (it exited 2, a usage error)."""
    assert main([]) == 0
    assert "serve" in capsys.readouterr().out
