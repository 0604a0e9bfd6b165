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
    try:
        _root.setLevel(envs.VLLM_LOGGING_LEVEL)
    except envs.EnvVarError as _error:
        # Read at the first import of anything in the package, before a command could report
        # it: a bad level is said (once a process) and logging goes on at the default.
        _root.setLevel("INFO")
        _root.warning("%s; logging at INFO", _error)
    _root.propagate = False


class _QuietThreads(logging.Filter):
    """Drops the records below the level that `quiet_below` set for the thread logging them."""

    def __init__(self) -> None:
        super().__init__()
        # Thread id -> level; each thread writes only its own entry.
        self.levels: dict[int, int] = {}

    def filter(self, record: logging.LogRecord) -> bool:
        level = self.levels.get(record.thread)
        return level is None or record.levelno >= level


_QUIET = _QuietThreads()
_root.addFilter(_QUIET)


def init_logger(name: str) -> logging.Logger:
    """The logger for module `name` (pass `__name__`)."""
    logger = logging.getLogger(name)
    # On the logger rather than on handlers: a logger's filters judge each record once, where it
    # is logged, before it goes to any handler (the logger's own, an ancestor's, the root's where
    # `vllm` propagates, one added later), so a dropped record reaches none of them.
    logger.addFilter(_QUIET)
    return logger


@contextmanager
def quiet_below(level: int) -> Iterator[None]:
    """Within: what this thread logs through `init_logger`'s loggers below `level` is dropped; other
    threads (a server's engine loop) log as before. For a dry run of work that is done again for
    real, whose logs would otherwise be said twice. Nested, the stricter level holds."""
    thread = threading.get_ident()
    outer = _QUIET.levels.get(thread)
    _QUIET.levels[thread] = level if outer is None else max(level, outer)
    try:
        yield
    finally:
        if outer is None:
            del _QUIET.levels[thread]
        else:
            _QUIET.levels[thread] = outer
