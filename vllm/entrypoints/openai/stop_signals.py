"""How `vllm serve` takes SIGINT and SIGTERM outside uvicorn's serving: the first begins the
shutdown through `finally` blocks, a second once it has begun ends the process at once, its
tensor-parallel workers killed (`run_server`, api_server.py, installs `StopSignals`)."""

import os
import signal
import sys
from typing import Any, NoReturn

from vllm.logger import init_logger

logger = init_logger(__name__)


class Terminated(Exception):
    """Raised by the SIGTERM handler so that shutdown runs through `finally` blocks."""


# The signals that stop the server: uvicorn's own handlers take them while it serves.
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


class StopSignals:
    """`run_server`'s handler of `STOP_SIGNALS` outside uvicorn's serving (uvicorn hands it the
    first signal it took once it has stopped serving). The first begins the shutdown, raising
    KeyboardInterrupt (SIGINT) or `Terminated` so that it runs through `finally` blocks. Once
    the shutdown has begun, another one ends the process at once (`exit_now`): the shutdown
    waits for the engine loop's step and for each worker to wind down (up to 10 s for one that is
    stuck), and a second Ctrl-C asks not to wait."""

    def __init__(self) -> None:
        self.shutting_down = False

    def __call__(self, signum: int, frame: Any) -> None:
        if self.shutting_down:
            exit_now(signum)
        self.shutting_down = True
        raise KeyboardInterrupt if signum == signal.SIGINT else Terminated()


def exit_now(signum: int) -> NoReturn:
    """Kill the tensor-parallel workers and end the process with the shell's status for the
    signal (130 for SIGINT), skipping the rest of the shutdown and the interpreter's exit."""
    for sig in STOP_SIGNALS:  # a third signal must not cut the kill short
        signal.signal(sig, signal.SIG_IGN)
    # Exits whatever the line's writing raises: this runs inside whatever the main thread was
    # doing, a write to stderr too (blocked on a full pipe), which cannot be re-entered
    # (RuntimeError). Escaping, that error left the process running with both signals ignored.
    try:
        # Not imported here where it never was (the engine not built): no worker can exist.
        executor = sys.modules.get("vllm.v1.executor.multiproc_executor")
        killed = 0 if executor is None else executor.kill_workers()
        logger.warning(
            "%s during shutdown: exiting now, without waiting for the engine to stop (%d "
            "tensor-parallel worker%s killed)",
            signal.Signals(signum).name,
            killed,
            "" if killed == 1 else "s",
        )
        # os._exit flushes nothing.
        for stream in (sys.stdout, sys.stderr):
            stream.flush()
    finally:
        os._exit(128 + signum)


def restore_handlers(handlers: dict[int, Any]) -> None:
    """Put back the handlers `signal.signal` returned (None: not set from Python, the default)."""
    for sig, handler in handlers.items():
        signal.signal(sig, signal.SIG_DFL if handler is None else handler)
