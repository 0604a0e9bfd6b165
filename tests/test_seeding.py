"""Every test starts from generators seeded by its own id (tests/conftest.py), not by test order."""

import zlib

import torch


def test_global_generator_is_seeded_from_the_test_id(request):
    assert torch.initial_seed() == zlib.crc32(request.node.nodeid.encode())
