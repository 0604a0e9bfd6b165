"""`supports_tma`: which devices the kernels may read through TMA tensor descriptors on."""

import pytest
import torch

import vllm.triton_utils as triton_utils
from vllm.triton_utils import supports_tma


@pytest.mark.parametrize(
    "capability,hip,expected",
    [((9, 0), None, True), ((10, 0), None, True), ((8, 9), None, False), ((9, 4), "6.2", False)],
)
def test_supports_tma_from_hopper_on_nvidia_only(capability, hip, expected, monkeypatch):
    monkeypatch.setattr(triton_utils, "_capability", lambda index: capability)
    monkeypatch.setattr(torch.version, "hip", hip)
    assert supports_tma(torch.device("cuda", 0)) is expected


def test_supports_tma_not_on_cpu_even_when_interpreting(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert not supports_tma(torch.device("cpu"))
