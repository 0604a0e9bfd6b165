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


@pytest.mark.parametrize("given,seen", [(None, "1 True"), ("0", "0 False"), ("1", "1 True")])
def test_import_keeps_triton_autotuning_results_unless_the_user_chose(given, seen):
    env = {k: v for k, v in os.environ.items() if k != "TRITON_CACHE_AUTOTUNING"}
    if given is not None:
        env["TRITON_CACHE_AUTOTUNING"] = given
    # What Triton's autotuner reads when a kernel is defined (fla-core's, after `import vllm`).
    code = (
        "import os, vllm, triton; "
        "print(os.environ.get('TRITON_CACHE_AUTOTUNING'), triton.knobs.autotuning.cache)"
    )
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == seen
