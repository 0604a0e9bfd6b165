"""Fixtures of the Kimi-K3 tests: transformers' Kimi-Linear modeling module, pure-torch path.

transformers binds fla's (and causal_conv1d's) kernels at import whenever those import, and they
fail on CPU; the independent reference is its torch code, so both are hidden while it is imported
(once per session; nothing else in the suite imports that module).
"""

import sys

import pytest


@pytest.fixture(scope="session")
def hf_kimi_linear():
    pytest.importorskip("transformers")
    hidden = ("fla", "causal_conv1d")
    saved = {k: v for k, v in sys.modules.items() if k.split(".")[0] in hidden}
    for name in hidden:
        sys.modules[name] = None
    try:
        from transformers.models.kimi_linear import modeling_kimi_linear
    finally:
        for name in hidden:
            del sys.modules[name]
        sys.modules.update(saved)
    return modeling_kimi_linear
