"""How often a thread waiting for the GIL gets it while a call runs: the measure of whether the
call lets the server's event loop run (a C call that holds the GIL gives it no turn)."""

import sys
import threading
import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def gil_turns(fn: Callable[[], T]) -> tuple[T, int]:
    """`fn()`'s result, and the turns another thread took meanwhile. With a switch interval of
    1 us, the waiting thread asks for the GIL almost at once and gets it at the next point between
    two bytecodes of `fn`, so the count follows the call's pieces, not the machine's speed."""
    turns, stop = [0], threading.Event()

    def other() -> None:
        while not stop.is_set():
            time.sleep(0)  # gives up the GIL, and waits to take it back
            turns[0] += 1

    interval = sys.getswitchinterval()
    thread = threading.Thread(target=other)
    sys.setswitchinterval(1e-6)
    try:
        thread.start()
        before = turns[0]
        result = fn()
        during = turns[0] - before
    finally:
        stop.set()
        thread.join()
        sys.setswitchinterval(interval)
    return result, during
