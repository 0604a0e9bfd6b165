"""The interpreter's rounding fix (vllm/triton_utils/interpreter_rounding.py): it rounds as torch
does, and installing it again (a benchmark's dry run inside the test session) changes nothing."""

import os

import numpy as np
import pytest
import torch

from vllm.triton_utils import interpreter_rounding

pytestmark = pytest.mark.skipif(
    os.environ.get("TRITON_INTERPRET") != "1", reason="the CPU half (Triton's interpreter)"
)


def test_fp32_to_fp8_rounds_as_torch_does() -> None:
    import triton.language as tl
    from triton.runtime import interpreter

    # 127.97 is where the unpatched interpreter drops the carry into the exponent (64).
    values = np.array([127.97, 0.3, -2.75, 448.0], dtype=np.float32)
    codes = interpreter._convert_float(values, tl.float32, tl.float8e4nv, None)
    expected = torch.from_numpy(values).to(torch.float8_e4m3fn).view(torch.uint8).numpy()
    np.testing.assert_array_equal(codes, expected)


def test_installing_again_changes_nothing() -> None:
    from triton.runtime import interpreter

    convert, create_dot = interpreter._convert_float, interpreter.InterpreterBuilder.create_dot
    restore = interpreter_rounding.install()  # the session's fixture installed it already
    assert interpreter._convert_float is convert
    assert interpreter.InterpreterBuilder.create_dot is create_dot
    restore()
    assert interpreter._convert_float is convert
