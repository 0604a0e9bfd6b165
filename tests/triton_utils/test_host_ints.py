"""The host-side int helpers of vllm.triton_utils (launch grids and block sizes)."""

import triton

from vllm.triton_utils import cdiv, next_power_of_2


def test_cdiv_is_tritons_ceiling_division():
    for a in range(0, 300):
        for b in (1, 2, 3, 16, 64, 127, 128, 1000):
            assert cdiv(a, b) == triton.cdiv(a, b) == -(-a // b)
    assert cdiv(2**40 + 1, 2**20) == 2**20 + 1


def test_next_power_of_2():
    assert [next_power_of_2(n) for n in (0, 1, 2, 3, 4, 5, 1023, 1024, 1025)] == [
        1, 1, 2, 4, 4, 8, 1024, 1024, 2048,
    ]  # fmt: skip
