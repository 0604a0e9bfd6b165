"""`vllm.envs`: switches read as 1 / 0 (or true / false, any case), their default when unset or
empty, and a clear error naming the variable for anything else: `VLLM_..._EPILOGUE=true` used to
turn the fused epilogue off without a word (only "1" was on)."""

import os
import subprocess
import sys

import pytest

import vllm.envs as envs

SWITCHES = {  # name -> default
    "VLLM_ROCM_USE_AITER": False,
    "VLLM_ROCM_USE_AITER_LINEAR": True,
    "VLLM_ROCM_USE_AITER_LINEAR_HIPBMM": False,
    "VLLM_KIMI_K3_FUSED_OPROJ_EPILOGUE": True,
    "VLLM_KIMI_FUSE_SHARED_EXPERTS": True,
    "VLLM_TRITON_PDL": True,
    "VLLM_KDA_PREFILL_GRAPHS": True,
}


@pytest.mark.parametrize("name, default", SWITCHES.items())
def test_switches(monkeypatch, name, default):
    monkeypatch.delenv(name, raising=False)
    assert getattr(envs, name) is default
    for raw, value in [("", default), ("1", True), ("0", False), ("true", True), ("False", False),
                       (" TRUE ", True)]:  # fmt: skip
        monkeypatch.setenv(name, raw)
        assert getattr(envs, name) is value, raw
    for raw in ("yes", "2", "on", "of"):
        monkeypatch.setenv(name, raw)
        with pytest.raises(ValueError, match=f"^{name}={raw!r}: expected 1 or 0"):
            getattr(envs, name)


def test_describe_names_a_bad_value_instead_of_failing(monkeypatch):
    monkeypatch.setenv("VLLM_TRITON_PDL", "yes")
    line = next(x for x in envs.describe().splitlines() if x.startswith("VLLM_TRITON_PDL="))
    assert line.startswith("VLLM_TRITON_PDL=<invalid: 'yes'>: ")


@pytest.mark.parametrize("name", SWITCHES)
def test_every_bad_variable_is_refused_but_the_logging_level(monkeypatch, name):
    for other in SWITCHES:
        monkeypatch.delenv(other, raising=False)
    monkeypatch.setenv("VLLM_LOGGING_LEVEL", "bogus")  # said at import; INFO instead
    assert envs.refused() == []
    monkeypatch.setenv(name, "yes")
    (error,) = envs.refused()
    assert isinstance(error, envs.EnvVarError)
    assert str(error).startswith(f"{name}='yes': expected 1 or 0"), error
    # Each bad one, not only the first: a recipe learns of all of them in one run.
    other = next(s for s in SWITCHES if s != name)
    monkeypatch.setenv(other, "on")
    assert sorted(str(e).split("=")[0] for e in envs.refused()) == sorted([name, other])


def test_logging_level(monkeypatch):
    monkeypatch.delenv("VLLM_LOGGING_LEVEL", raising=False)
    assert envs.VLLM_LOGGING_LEVEL == "INFO"
    cases = [("", "INFO"), ("debug", "DEBUG"), (" Warning ", "WARNING"), ("warn", "WARN")]
    for raw, level in cases:
        monkeypatch.setenv("VLLM_LOGGING_LEVEL", raw)
        assert envs.VLLM_LOGGING_LEVEL == level
    monkeypatch.setenv("VLLM_LOGGING_LEVEL", "bogus")
    with pytest.raises(ValueError, match="^VLLM_LOGGING_LEVEL='bogus': expected a logging level"):
        _ = envs.VLLM_LOGGING_LEVEL


def test_a_bad_logging_level_is_said_once_and_logging_goes_on_at_info():
    """It is read at the package's first import, before any command could report it: that was
    a traceback, even for `vllm --help`."""
    script = "import logging, vllm.logger as l; print(logging.getLevelName(l._root.level))"
    env = {**os.environ, "VLLM_LOGGING_LEVEL": "bogus"}
    run = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True,
                         timeout=120)  # fmt: skip
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == "INFO"
    assert "VLLM_LOGGING_LEVEL='bogus': expected a logging level" in run.stderr
    assert "logging at INFO" in run.stderr and "Traceback" not in run.stderr
