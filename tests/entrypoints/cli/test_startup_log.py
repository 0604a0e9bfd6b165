"""The start-up summary's arithmetic: how many full-length requests the cache holds at once."""

import argparse
import logging
from types import SimpleNamespace

import pytest

from vllm.entrypoints.cli import startup
from vllm.v1.core.kv_cache_manager import KVCacheManager


def _engine(num_blocks: int, block_size: int, max_model_len: int) -> SimpleNamespace:
    config = SimpleNamespace(
        model_config=SimpleNamespace(
            model="m", dtype="torch.float32", max_model_len=max_model_len,
            quantization_config=None, enforce_eager=True,
        ),
        cache_config=SimpleNamespace(block_size=block_size),
        scheduler_config=SimpleNamespace(max_num_seqs=256, max_num_batched_tokens=8192),
        parallel_config=SimpleNamespace(tensor_parallel_size=1),
        compilation_config=SimpleNamespace(cudagraph_capture_sizes=[]),
        device="cpu",
    )  # fmt: skip
    kv = KVCacheManager(num_blocks, block_size, num_kda_slots=300)
    return SimpleNamespace(config=config, kv_cache_manager=kv)


def _fits(kv: KVCacheManager, max_model_len: int) -> int:
    """Full-length requests that the cache really holds at once: allocate until it refuses."""
    held = 0
    while True:
        request = SimpleNamespace(request_id=f"r{held}", num_computed_tokens=0)
        # A full-length request caches all its tokens but the last sampled one.
        if not kv.allocate_slots(request, max_model_len - 1):
            return held
        held += 1


@pytest.mark.parametrize(
    "num_blocks, block_size, max_model_len",
    [(9, 64, 100), (9, 64, 65), (9, 64, 128), (101, 16, 1000), (17, 16, 64)],
)
def test_max_concurrency_counts_whole_blocks(
    caplog: pytest.LogCaptureFixture, num_blocks: int, block_size: int, max_model_len: int
) -> None:
    engine = _engine(num_blocks, block_size, max_model_len)
    log = logging.getLogger(startup.__name__)
    log.addHandler(caplog.handler)
    try:
        with caplog.at_level(logging.INFO, logger=startup.__name__):
            startup.log_startup(engine, ["m"], argparse.Namespace())
    finally:
        log.removeHandler(caplog.handler)
    expected = _fits(engine.kv_cache_manager, max_model_len)
    assert f"max concurrency for {max_model_len}-token requests: {expected} " in caplog.text
