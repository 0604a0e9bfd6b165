"""The accuracy script's server handling and results files: `Server` learns the port a server
bound on port 0 from its log, waits for /health, and stops the server's whole session on exit;
`write_report` writes its files whole or not at all."""

import os
import sys
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
FAKE_SERVER = ROOT / "tests" / "entrypoints" / "openai" / "fake_server.py"


@pytest.fixture
def run_gsm8k_pairs(monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks" / "accuracy"))
    import run_gsm8k_pairs

    return run_gsm8k_pairs


def test_server_reads_its_port_from_the_log_and_stops(run_gsm8k_pairs, tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    command = [sys.executable, str(FAKE_SERVER), "0", "Four."]
    server = run_gsm8k_pairs.Server(command, env, tmp_path / "server.log", timeout=60)
    with server:
        assert server.port is not None and server.port > 0
        with urllib.request.urlopen(f"http://127.0.0.1:{server.port}/health", timeout=5) as r:
            assert r.status == 200
        pid = server.proc.pid
    assert server.proc.poll() is not None
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)


def test_server_that_exits_before_binding_is_an_error(run_gsm8k_pairs, tmp_path):
    command = [sys.executable, "-c", "raise SystemExit(3)"]
    server = run_gsm8k_pairs.Server(command, dict(os.environ), tmp_path / "server.log", timeout=30)
    with pytest.raises(RuntimeError, match="server exited with 3"):
        server.__enter__()


def test_lm_eval_command_points_at_the_bound_port(run_gsm8k_pairs, tmp_path):
    (tmp_path / "config.json").write_text("{}")
    args = run_gsm8k_pairs.parse_args([str(tmp_path), "--out", str(tmp_path), "--limit", "4"])
    command = run_gsm8k_pairs.lm_eval_command(args, 43210, tmp_path / "r")
    model_args = command[command.index("--model_args") + 1]
    assert "base_url=http://127.0.0.1:43210/v1/completions" in model_args
    assert command[-2:] == ["--limit", "4"]


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--limit", "0"], "argument --limit: must be >= 1, got 0"),
        (["--compare-limit", "-2"], "argument --compare-limit: must be >= 1, got -2"),
        (["--kl-limit", "0"], "argument --kl-limit: must be >= 1, got 0"),
        (["--num-fewshot", "-1"], "argument --num-fewshot: must be >= 0, got -1"),
        (["--max-gen-toks", "0"], "argument --max-gen-toks: must be >= 1, got 0"),
        (["--max-model-len", "0"], "argument --max-model-len: must be >= 1, got 0"),
        (["--num-concurrent", "0"], "argument --num-concurrent: must be >= 1, got 0"),
        (["--batch", "0"], "argument --batch: must be >= 1, got 0"),
    ],
)
def test_bad_sizes_are_refused_by_flag(run_gsm8k_pairs, tmp_path, capsys, argv, message):
    """Were taken as given: --batch 0 and --kl-limit 0 failed with a traceback after the lm_eval
    runs (minutes each), --limit 0 silently meant all 500 documents."""
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(SystemExit) as exit_info:
        run_gsm8k_pairs.parse_args([str(tmp_path), "--out", str(tmp_path / "out"), *argv])
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


def test_a_missing_model_folder_or_a_file_for_out_is_refused(run_gsm8k_pairs, tmp_path, capsys):
    """A missing model was a traceback from the first server or LLM (after earlier modes' runs
    with --modes), an --out that is a file a FileExistsError."""
    missing = tmp_path / "no-such-model"
    with pytest.raises(SystemExit) as exit_info:
        run_gsm8k_pairs.parse_args([str(missing), "--out", str(tmp_path / "out")])
    assert exit_info.value.code == 2
    assert f"argument model: '{missing}' is not a model folder (no config.json)" in (
        capsys.readouterr().err
    )
    # A folder without config.json (not a checkpoint) is refused alike.
    missing.mkdir()
    with pytest.raises(SystemExit):
        run_gsm8k_pairs.parse_args([str(missing), "--out", str(tmp_path / "out")])
    assert "is not a model folder (no config.json)" in capsys.readouterr().err
    (tmp_path / "config.json").write_text("{}")
    a_file = tmp_path / "a-file"
    a_file.write_text("x")
    with pytest.raises(SystemExit) as exit_info:
        run_gsm8k_pairs.parse_args([str(tmp_path), "--out", str(a_file)])
    assert exit_info.value.code == 2
    assert f"argument --out: '{a_file}' exists and is not a folder" in capsys.readouterr().err


def test_results_are_written_whole_or_not_at_all(run_gsm8k_pairs, tmp_path, monkeypatch):
    import errno
    import json

    (tmp_path / "results.json").write_text('{"run": 1}\n')

    def full_disk_after_half(record, f, **kwargs):
        text = json.dumps(record, **kwargs)
        f.write(text[: len(text) // 2])
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(json, "dump", full_disk_after_half)
    with pytest.raises(OSError, match="No space left"):
        run_gsm8k_pairs.write_report(tmp_path, {"run": 2, "rows": list(range(100))})
    assert (tmp_path / "results.json").read_text() == '{"run": 1}\n'
    assert os.listdir(tmp_path) == ["results.json"]
