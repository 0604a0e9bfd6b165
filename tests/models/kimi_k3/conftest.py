"""Fixtures of the Kimi-K3 tests: transformers' Kimi-Linear modeling module, pure-torch path
(imported once per session, with fla hidden: see tests/hf_kimi_linear.py)."""

import pytest
from hf_kimi_linear import import_modeling_kimi_linear


@pytest.fixture(scope="session")
def hf_kimi_linear():
    pytest.importorskip("transformers")
    return import_modeling_kimi_linear()
