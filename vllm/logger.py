"""Logging for the fork: `init_logger(__name__)` gives a logger under the `vllm` root."""

import logging
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


@contextmanager
def logging_at_least(level: int) -> Iterator[None]:
    """Within: the fork's loggers drop records below `level`. For a dry run of work that is done
    again for real (whose logs would otherwise be said twice)."""
    saved = _root.level
    _root.setLevel(max(level, saved))
    try:
        yield
    finally:
        _root.setLevel(saved)
