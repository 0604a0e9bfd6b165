"""The model runner's start-up progress bars (`startup_progress`): on the first TP rank only, and
off where tqdm's environment says so."""

import os
import subprocess
import sys

import pytest

import vllm.v1.worker.model_runner as runner_module
from vllm.v1.worker.model_runner import startup_progress


@pytest.mark.parametrize("rank, shown", [(0, True), (1, False)])
def test_the_bar_is_the_first_ranks(monkeypatch, capsys, startup_bars, rank, shown):
    monkeypatch.setattr(runner_module, "get_tensor_model_parallel_rank", lambda: rank)
    assert list(startup_progress([3, 1, 2], "Warming up things")) == [3, 1, 2]
    err = capsys.readouterr().err
    if shown:
        assert "Warming up things: 100%" in err and "3/3" in err
    else:
        assert err == ""


def test_tqdm_disable_in_the_environment_turns_the_bar_off():
    """tqdm reads `TQDM_DISABLE` when it is imported: a process started with it shows no bar."""
    code = (
        "import vllm.v1.worker.model_runner as m\n"
        "m.get_tensor_model_parallel_rank = lambda: 0\n"
        "assert list(m.startup_progress([1, 2], 'Warming up things')) == [1, 2]\n"
    )
    environ = {k: v for k, v in os.environ.items() if k != "TQDM_DISABLE"}
    for env, shown in (({"TQDM_DISABLE": "1"}, False), ({}, True)):
        done = subprocess.run(
            [sys.executable, "-c", code], env={**environ, **env}, capture_output=True,
            text=True, check=True,
        )  # fmt: skip
        assert ("Warming up things" in done.stderr) == shown, done.stderr
