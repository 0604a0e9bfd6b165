"""`import vllm` sets torch's cuDNN attention to per-length-class plans unless the user chose,
in a fresh interpreter each (the setting is made once, at the package's first import)."""

import os
import subprocess
import sys

import pytest

NAME = "TORCH_CUDNN_SDPA_AVOID_RECOMPILE"


def value_after_import(env_value: str | None) -> str:
    env = {k: v for k, v in os.environ.items() if k != NAME}
    if env_value is not None:
        env[NAME] = env_value
    code = (
        "import os, vllm.env_override as e; "
        f"print(os.environ.get({NAME!r}), e.cudnn_sdpa_avoids_recompile())"
    )
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


@pytest.mark.parametrize(
    "given,seen",
    [(None, "1 True"), ("0", "0 False"), ("1", "1 True"), ("true", "true False")],
)
def test_import_sets_the_cudnn_attention_default_and_keeps_the_users(given, seen):
    # "true" is not torch's "1": torch warns and keeps the per-shape plans, and so must the op.
    assert value_after_import(given) == seen
