"""Logging for the fork: `init_logger(__name__)` gives a logger under the `vllm` root."""

import logging
import threading
from collections.abc import Iterator
from contextlib import contextmanager

from vllm import envs

_root = logging.getLogger("vllm")
if not _root.handlers:
    _handler = logging.StreamHandler()
    _handler.setFormatter(
        logging.Formatter("%(levelname)s %(asctime)s [%(filename)s:%(lineno)d] %(message)s")
    )
    _root.addHandler(_handler)
    _root.setLevel(envs.VLLM_LOGGING_LEVEL)
    _root.propagate = False


def init_logger(name: str) -> logging.Logger:
    """The logger for module `name` (pass `__name__`)."""
    return logging.getLogger(name)


class _QuietThread(logging.Filter):
    """Drops the records below `level` that one thread logs."""

    def __init__(self, thread: int, level: int) -> None:
        super().__init__()
        self.thread, self.level = thread, level

    def filter(self, record: logging.LogRecord) -> bool:
        return record.thread != self.thread or record.levelno >= self.level


@contextmanager
def quiet_below(level: int) -> Iterator[None]:
    """Within: what this thread logs through the fork's loggers below `level` is dropped; other
    threads (a server's engine loop) log as before. For a dry run of work that is done again for
    real, whose logs would otherwise be said twice."""
    quiet = _QuietThread(threading.get_ident(), level)
    handlers = list(_root.handlers)
    for handler in handlers:
        handler.addFilter(quiet)
    try:
        yield
    finally:
        for handler in handlers:
            handler.removeFilter(quiet)
