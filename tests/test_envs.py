"""`vllm.envs`: switches read as 1 / 0 (or true / false, any case), their default when unset or
empty, and a clear error naming the variable for anything else: `VLLM_..._EPILOGUE=true` used to
turn the fused epilogue off without a word (only "1" was on)."""

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
