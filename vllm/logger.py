"""Logging for the fork: `init_logger(__name__)` gives a logger under the `vllm` root."""

import logging

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
