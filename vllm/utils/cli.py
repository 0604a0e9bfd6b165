"""Running a command-line `main` (the `vllm` command, the scripts under benchmarks/)."""

import sys
from collections.abc import Callable


def run_main(main: Callable[[], int | None]) -> int | None:
    """`main()`'s exit status, with Ctrl-C (a KeyboardInterrupt out of it) ending the process
    with one line and status 130 (the shell's status for SIGINT) instead of a traceback of
    wherever the interrupt landed. `main`'s own `finally` blocks (engine shutdown, workers
    stopped, the last complete `--output-json` record kept) have run by then."""
    try:
        return main()
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr, flush=True)
        return 130
