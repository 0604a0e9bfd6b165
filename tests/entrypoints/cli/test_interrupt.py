"""Ctrl-C at any point of `vllm serve` or a benchmark script ends it with one line and status 130,
not a traceback of wherever the interrupt landed (the server's own handlers take over once it
serves; docs/serving.md)."""

import ast
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]

# In a fresh interpreter: a SIGINT arrives while the engine config is checked (as a Ctrl-C
# during start-up would), then the command or script runs as from the shell.
INTERRUPT = """
import os, runpy, signal, sys
from vllm.engine.arg_utils import EngineArgs
def interrupted(self):
    os.kill(os.getpid(), signal.SIGINT)
    signal.pause()
EngineArgs.create_engine_config = interrupted
sys.argv = sys.argv[1:]
sys.path.insert(0, os.path.dirname(sys.argv[0]))  # as `python SCRIPT` does
runpy.run_path(sys.argv[0], run_name="__main__")
"""


def run_interrupted(script: Path, *argv: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.run(
        [sys.executable, "-c", INTERRUPT, str(script), *argv], capture_output=True, text=True,
        timeout=120, env=env, cwd=ROOT,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )  # fmt: skip


@pytest.mark.parametrize(
    "script, argv",
    [
        (ROOT / "vllm" / "entrypoints" / "cli" / "main.py", ["serve", "kimi-k3-tiny"]),
        (ROOT / "benchmarks" / "benchmark_throughput.py", ["--dry-run"]),
        (ROOT / "benchmarks" / "benchmark_latency.py", ["--dry-run"]),
    ],
)
def test_ctrl_c_is_one_line_and_status_130(script: Path, argv: list[str]) -> None:
    done = run_interrupted(script, *argv)
    assert done.returncode == 130, done.stderr[-2000:]
    assert done.stderr.strip().splitlines()[-1] == "interrupted"
    assert "Traceback" not in done.stderr


def test_every_script_main_handles_ctrl_c() -> None:
    """Each engine and kernel benchmark run as `__main__` goes through `run_main`."""
    scripts = sorted(
        [*(ROOT / "benchmarks").glob("*.py"), *(ROOT / "benchmarks").glob("kernels/*.py")]
    )
    checked = 0
    for path in scripts:
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.If) and "__main__" in ast.unparse(node.test):
                assert "run_main(main)" in ast.unparse(node), path
                checked += 1
    assert checked >= 20


def test_the_vllm_command_imports_torch_inside_its_ctrl_c_handling() -> None:
    code = "import sys, vllm.entrypoints.cli.main; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert out.stdout.strip() == "False", out.stderr


class _Exited(BaseException):
    """`os._exit`, faked: the status it was called with."""


def test_a_second_signal_exits_even_where_its_line_cannot_be_written(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The server's exit on a second signal during shutdown logs a line from the signal handler,
    inside whatever the main thread was doing: a write to stderr blocked on a full pipe (a slow
    log collector) cannot be re-entered, and its RuntimeError escaped the handler before
    `os._exit`, leaving the server running with SIGINT and SIGTERM ignored."""
    from vllm.entrypoints.openai import stop_signals
    from vllm.v1.executor import multiproc_executor

    def exit_(status: int) -> None:
        raise _Exited(status)

    def reentered(*args, **kwargs) -> None:
        raise RuntimeError("reentrant call inside <_io.BufferedWriter name='<stderr>'>")

    monkeypatch.setattr(multiproc_executor, "kill_workers", lambda: 0)
    monkeypatch.setattr(stop_signals.logger, "warning", reentered)
    monkeypatch.setattr(os, "_exit", exit_)
    handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    stop = stop_signals.StopSignals()
    stop.shutting_down = True
    try:
        with pytest.raises(_Exited) as exited:
            stop(signal.SIGINT, None)
    finally:
        for sig, handler in handlers.items():
            signal.signal(sig, handler)
    assert exited.value.args == (130,)
