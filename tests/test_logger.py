"""`quiet_below`: what the quiet thread logs below the level reaches no handler at all (the
`vllm` logger's, one on a logger between it and the module's, one added inside the block, the
root's where `vllm` propagates), while other threads' records and records at or above the level
reach all of them."""

import logging
import threading
from collections.abc import Iterator

import pytest

from vllm.logger import init_logger, quiet_below


class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


@pytest.fixture
def handlers() -> Iterator[dict[str, _Records]]:
    """A handler on the `vllm` logger, on `vllm.test_quiet` (an ancestor of the logging module's
    logger), and on the root logger with `vllm` propagating to it, as an application's own
    logging configuration might set it."""
    vllm_root = logging.getLogger("vllm")
    loggers = {
        "vllm": vllm_root,
        "vllm.test_quiet": logging.getLogger("vllm.test_quiet"),
        "root": logging.getLogger(),
    }
    attached = {name: _Records() for name in loggers}
    propagate, level = vllm_root.propagate, vllm_root.level
    vllm_root.propagate = True
    vllm_root.setLevel(logging.INFO)
    for name, logger in loggers.items():
        logger.addHandler(attached[name])
    try:
        yield attached
    finally:
        for name, logger in loggers.items():
            logger.removeHandler(attached[name])
        vllm_root.propagate, vllm_root.level = propagate, level


def test_every_handler_a_quiet_record_would_reach_drops_it(handlers) -> None:
    logger = init_logger("vllm.test_quiet.module")
    late = _Records()
    with quiet_below(logging.ERROR):
        logging.getLogger("vllm").addHandler(late)  # added inside the block
        try:
            logger.warning("from the dry run")
            other = threading.Thread(target=lambda: logger.warning("from the engine loop"))
            other.start()
            other.join()
            logger.error("an error still shows")
        finally:
            logging.getLogger("vllm").removeHandler(late)
    logger.warning("after")
    for name, handler in handlers.items():
        assert handler.messages == ["from the engine loop", "an error still shows", "after"], name
    assert late.messages == ["from the engine loop", "an error still shows"]


def test_nested_blocks_quiet_no_less_than_the_outer_one(handlers) -> None:
    logger = init_logger("vllm.test_quiet.module")
    with quiet_below(logging.ERROR):
        with quiet_below(logging.WARNING):
            logger.warning("inner warning")
        logger.warning("outer warning")
        with quiet_below(logging.CRITICAL):
            logger.error("inner error")
        logger.error("outer error")
    logger.info("after")
    assert handlers["vllm"].messages == ["outer error", "after"]
