"""The executor: rank 0's model runner in this process plus, for tensor parallelism, one worker
process per other rank.

Workers are spawned processes that join a torch.distributed group (NCCL on GPU, gloo on CPU) and
then follow rank 0: each control message is `(method, *args)` on a pipe, and the worker calls
the same method of its own runner. Tensors only move through collectives (the model's, and the
broadcast of rank 0's sampled ids that starts a step launched ahead, whose message has no input
ids: `ModelRunner._last_sampled_rows`); the pipes carry the step's host data: `execute`'s
`StepInput` as a `StepMessage`, whose block tables are only their changes since the last step
(`step_message.py`). Only rank 0 samples.

A worker that raises sends its traceback and exits; one that dies is noticed by its pipe closing or
its process ending. Either fails the engine with `RuntimeError` naming the rank instead of hanging
(except where rank 0 raised the very same error as the failed worker, as every rank does for a model
that cannot be built: then rank 0's own exception, a `ValueError` say, is raised): a collective with
a dead gloo peer errors out, and rank 0 checks the workers around every call. Rank 0 failing on its
own in a call the workers run (an exception, Ctrl-C) leaves them in collectives it will not match:
the workers are stopped at once and later calls are refused. At start-up each
worker reports that it is running before rank 0 enters the rendezvous, which would otherwise wait
for a worker that died while bootstrapping (e.g. a script without the `if __name__ == "__main__":`
guard that spawn needs) until the collective timeout; both that worker's error and rank 0's name
the guard. Rank 0 then joins the group on a thread while it keeps checking the workers, so one
that fails or dies between its report and the join fails the start-up as well. `workers_alive`
answers from any thread whether every worker still runs (the server's health check). A worker
whose rank 0 process ended without stopping it exits at once (`_exit_with_parent`).
"""

import atexit
import contextlib
import multiprocessing as mp
import os
import signal
import sys
import threading
import time
import traceback
import weakref
from collections.abc import Callable, Iterator
from datetime import timedelta
from multiprocessing import connection as mp_connection
from typing import Any, NoReturn
from urllib.parse import urlsplit

import torch
import torch.distributed as dist

from vllm.config.vllm import VllmConfig
from vllm.distributed import (
    destroy_model_parallel,
    get_tensor_model_parallel_world_size,
    initialize_model_parallel,
)
from vllm.logger import init_logger
from vllm.utils.gc_utils import freeze_startup_heap, unfreeze_heap
from vllm.v1.executor.step_message import StepDecoder, StepEncoder
from vllm.v1.worker.model_runner import ModelRunner

logger = init_logger(__name__)


class WorkerFailed(RuntimeError):
    """A worker raised: its traceback is the message and `traceback`."""

    def __init__(self, rank: int, formatted_traceback: str) -> None:
        super().__init__(f"tensor-parallel worker {rank} failed:\n{formatted_traceback}")
        self.traceback = formatted_traceback

    def raised(self, error: BaseException) -> bool:
        """Whether the worker's traceback ends with `error` as `traceback` writes it: its type
        (with its module unless a builtin), its whole message and its notes."""
        block = "".join(traceback.format_exception_only(error)).strip()
        return ("\n" + self.traceback.strip()).endswith("\n" + block)


# Long enough for the first Triton compilation of a step; a dead peer fails a gloo collective at
# once, this bounds a hung NCCL one.
_COLLECTIVE_TIMEOUT = timedelta(minutes=10)
# How long shutdown waits for all the workers together before killing the ones left.
_SHUTDOWN_WAIT_S = 10.0
# Methods whose workers answer (start-up); step messages are not answered, to keep steps fast.
_ANSWERED = frozenset({"load_model", "available_cache_memory", "warm_up_prefill_steps",
                       "initialize_cache", "capture_cudagraphs"})  # fmt: skip


def rank_cpu_threads(tensor_parallel_size: int) -> int | None:
    """Intra-op CPU threads for each rank of a TP engine: the cores this process may run on, shared
    evenly (at least one a rank); None where `OMP_NUM_THREADS` is set (the user's choice, which
    the spawned ranks inherit; empty counts as unset, as OpenMP ignores it). At torch's default
    every rank starts a thread per core, and an OpenMP thread that spins after its parallel
    region holds a core that the other ranks' collectives wait on (docs/performance.md,
    "Thirty-eighth run": about 4x slower at TP = 2 on 2 cores)."""
    if os.environ.get("OMP_NUM_THREADS"):
        return None
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return max(1, (cores or 1) // tensor_parallel_size)


def tcp_store(host: str, port: int, world_size: int, is_master: bool, **kwargs) -> dist.TCPStore:
    """The TP rendezvous store: on libuv unless `USE_LIBUV=0`, as torch's own `tcp://`
    rendezvous chooses (a store built directly would take libuv whatever the variable says)."""
    return dist.TCPStore(
        host, port, world_size, is_master=is_master, timeout=_COLLECTIVE_TIMEOUT,
        use_libuv=os.environ.get("USE_LIBUV", "1") == "1", **kwargs,
    )  # fmt: skip


def _init_distributed(config: VllmConfig, rank: int, store: dist.Store | None = None) -> None:
    """Join the TP group through the rendezvous store: rank 0 passes the one it created, a
    worker connects to it at `distributed_init_method`. Every rank must pass a store: torch
    prefixes the keys with `default_pg/` only on the `init_method` path."""
    world_size = config.parallel_config.tensor_parallel_size
    if store is None:
        address = urlsplit(config.parallel_config.distributed_init_method)
        store = tcp_store(address.hostname, address.port, world_size, is_master=False)
    backend = "nccl" if config.device == "cuda" else "gloo"
    dist.init_process_group(
        backend, store=store, rank=rank, world_size=world_size, timeout=_COLLECTIVE_TIMEOUT
    )
    initialize_model_parallel(config.parallel_config.tensor_parallel_size)


# Signals sent to a whole process group that the workers leave to rank 0 (`_worker_main`).
_GROUP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


@contextlib.contextmanager
def _group_signals_deferred() -> Iterator[None]:
    """`_GROUP_SIGNALS` held back inside, then delivered. Blocked for the calling thread: a
    worker spawned here starts with them blocked (the mask survives exec), so a Ctrl-C during
    its imports stays pending until `_worker_main` ignores them, which discards it (Python's
    KeyboardInterrupt would come out of some import as a traceback). In the main thread their
    Python handlers are also replaced by a recorder, since another thread of the process may
    take one: a Ctrl-C then interrupts rank 0 after the block, once the worker it spawned is
    in its list, for `shutdown` to stop, not inside `Process.start`."""
    caught: list[int] = []
    main = threading.current_thread() is threading.main_thread()
    handlers = {}
    if main:
        handlers = {s: signal.signal(s, lambda sig, _: caught.append(sig)) for s in _GROUP_SIGNALS}
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, _GROUP_SIGNALS)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)  # what was blocked reaches the recorder
        for sig, handler in handlers.items():  # None: not set from Python, the default
            signal.signal(sig, signal.SIG_DFL if handler is None else handler)
        for sig in dict.fromkeys(caught):
            signal.raise_signal(sig)


# A worker's exit status when rank 0's process has ended without stopping it.
_ORPHAN_EXIT_CODE = 3


def _exit_with_parent() -> None:
    """End this worker as soon as the process that spawned it (rank 0) ends, from a daemon
    thread. A worker notices a rank 0 that died without stopping it (killed, or out of memory)
    at its next pipe read or gloo collective, but one busy in a long step, in an NCCL collective
    (which does not see a dead peer) or waiting to join the group went on until the collective
    timeout (10 minutes), holding its GPU's memory. Nothing is left to report to, so it exits at
    once (`os._exit`, `_ORPHAN_EXIT_CODE`)."""
    parent = mp.parent_process()
    if parent is None:
        return

    def watch() -> None:
        # A process rank 0 forked (a helper, a fork-context pool) holds the sentinel's other
        # end too and would hide rank 0's end until its own: the parent pid changes at once.
        while not mp_connection.wait([parent.sentinel], timeout=1.0):
            if os.getppid() != parent.pid:
                break
        os._exit(_ORPHAN_EXIT_CODE)

    threading.Thread(target=watch, name="tp-parent-watch", daemon=True).start()


def _worker_main(rank: int, config: VllmConfig, conn) -> None:
    _exit_with_parent()
    # Ctrl-C in a terminal signals the whole process group, and so do service managers' SIGTERM
    # (systemd's default KillMode) and `kill -- -PGID`. Rank 0 stops the workers through their
    # pipes once the server has wound down (and kills any left); a worker killed by the signal
    # mid-step would instead fail rank 0's collective and turn a clean shutdown into an engine
    # error.
    for sig in _GROUP_SIGNALS:
        signal.signal(sig, signal.SIG_IGN)
    # Blocked since the spawn (`_group_signals_deferred`); ignored now, so what the worker starts
    # (compilers) inherits them ignored rather than blocked.
    signal.pthread_sigmask(signal.SIG_UNBLOCK, _GROUP_SIGNALS)
    threads = rank_cpu_threads(config.parallel_config.tensor_parallel_size)
    if threads is not None:
        torch.set_num_threads(threads)
    try:
        conn.send(("ok", "started"))
        _init_distributed(config, rank)
        runner = ModelRunner(config, rank)
        decoder = StepDecoder()
        while True:
            method, *args = conn.recv()
            if method == "shutdown":
                unfreeze_heap()
                break
            if method == "execute":
                args = [decoder.decode(*args)]
            result = getattr(runner, method)(*args)
            if method == "capture_cudagraphs":  # the last start-up step
                freeze_startup_heap()
            if method in _ANSWERED:
                conn.send(("ok", result))
    except Exception:
        conn.send(("error", traceback.format_exc()))
        raise SystemExit(1) from None
    finally:
        destroy_model_parallel()
        if dist.is_initialized():
            dist.destroy_process_group()


# The name of rank r's process is this plus r: a process so named is one of our workers.
_WORKER_NAME = "vllm-tp-worker-"
_GUARD_HINT = (
    "each worker is a spawned process that first imports the script that started the engine: a "
    'script must start a tensor-parallel engine under `if __name__ == "__main__":`.'
)


def kill_workers(wait_s: float = 5.0) -> int:
    """Kill this process's tensor-parallel workers at once (SIGKILL) and reap them (waiting at
    most `wait_s` for all of them together); how many were running. For a process that must end
    now, without its executors' shutdown, which waits for each worker to wind down: a worker left
    to itself would outlive rank 0 by up to a second (`_exit_with_parent`), or for good if it
    cannot run its watch (stopped, say)."""
    workers = [p for p in mp.active_children() if p.name.startswith(_WORKER_NAME)]
    for proc in workers:
        proc.kill()
    deadline = time.monotonic() + wait_s
    for proc in workers:
        proc.join(timeout=max(0.0, deadline - time.monotonic()))
    return len(workers)


class Executor:
    # Rank 0's own intra-op threads before a CPU TP engine shared the cores out (restored at
    # shutdown). On a GPU rank 0 keeps them: its CPU work is the host's, not the model's.
    _saved_threads: int | None = None
    # The interpreter-exit shutdown (`_stop_at_exit`), registered while workers may run.
    _exit_hook: Callable[[], None] | None = None

    def __init__(self, config: VllmConfig) -> None:
        if mp.current_process().name.startswith(_WORKER_NAME):
            # Set while the worker imports its parent's main script, before any of its own code
            # (multiprocessing's error from the start below is about freezing executables).
            raise RuntimeError(
                f"this process ({mp.current_process().name}, pid {os.getpid()}) is a worker "
                f"importing its parent's main script, which starts an engine: {_GUARD_HINT}"
            )
        self.config = config
        tp = config.parallel_config.tensor_parallel_size
        # The TP group is the process's default group and the TP size a process-wide setting
        # that every layer reads when it is built: one TP engine per process, and no other engine
        # beside it (a TP=1 model built now would shard itself and wait in collectives).
        if get_tensor_model_parallel_world_size() > 1 or (tp > 1 and dist.is_initialized()):
            raise RuntimeError(
                "a tensor-parallel engine already runs in this process; shut it down before "
                "starting another engine"
            )
        self.workers: list[tuple[Any, Any]] = []  # (process, pipe)
        self._encoder = StepEncoder()
        # Whether this executor initialized the (process-global) TP group and must destroy it.
        self._owns_group = False
        # Why the engine cannot go on, once rank 0 failed in a call the workers also run.
        self._failure: str | None = None
        try:
            threads = rank_cpu_threads(tp) if tp > 1 and config.device == "cpu" else None
            if threads is not None:
                self._saved_threads = torch.get_num_threads()
                torch.set_num_threads(threads)
            if tp > 1:
                self._stop_at_exit()
                # The rendezvous store binds its port before any worker starts: a port found
                # free and released first could be taken by another process in between.
                store = tcp_store("127.0.0.1", 0, tp, is_master=True, wait_for_workers=False)
                config.parallel_config.distributed_init_method = f"tcp://127.0.0.1:{store.port}"
                ctx = mp.get_context("spawn")
                for rank in range(1, tp):
                    parent, child = ctx.Pipe()
                    name = f"{_WORKER_NAME}{rank}"
                    proc = ctx.Process(
                        target=_worker_main, args=(rank, config, child), name=name, daemon=True
                    )
                    with _group_signals_deferred():
                        proc.start()
                        self.workers.append((proc, parent))
                for rank in range(1, tp):
                    self._answer(rank, starting=True)  # "started"
                self._join_group(config, store)
            self.runner = ModelRunner(config, 0)
        except BaseException:
            self.shutdown()
            raise

    def _stop_at_exit(self) -> None:
        """Shut down at interpreter exit if nothing did before. multiprocessing's own exit
        handler (registered when `multiprocessing.util` is imported, which this module's import
        of `multiprocessing.connection` does: so it runs after this one) sends the daemon
        workers SIGTERM, which they ignore (`_worker_main`), then joins them without a timeout:
        a script that never shut its TP engine down hung at exit. Holds the executor weakly."""
        ref = weakref.ref(self)

        def stop() -> None:
            executor = ref()
            if executor is not None:
                executor.shutdown()

        self._exit_hook = stop
        atexit.register(stop)

    def _join_group(self, config: VllmConfig, store: dist.Store) -> None:
        """Rank 0 joins the TP group in a thread while this one watches the workers: a worker
        that fails or dies after "started" but before joining (it cannot reach the store, it is
        killed) left rank 0 in the rendezvous until the collective timeout, deaf to Ctrl-C, its
        error unread in the pipe. Raised here, the shutdown that follows kills the workers; the
        thread is then left waiting in the rendezvous (a daemon, until the store's timeout).
        The group is this executor's (`_owns_group`, which its shutdown destroys) once joined,
        unless the start-up was given up first: then the thread destroys it itself, so that a
        failed start-up leaves no group to refuse the process's next engine."""
        error: list[BaseException] = []
        handover = threading.Lock()
        abandoned = False

        def join() -> None:
            try:
                _init_distributed(config, 0, store)
            except BaseException as e:  # re-raised on the calling thread
                error.append(e)
                return
            with handover:
                if abandoned:
                    destroy_model_parallel()
                    dist.destroy_process_group()
                else:
                    self._owns_group = True

        thread = threading.Thread(target=join, name="tp-rendezvous", daemon=True)
        thread.start()
        try:
            while thread.is_alive():
                thread.join(timeout=0.5)
                if thread.is_alive():
                    self._check_workers()
        except BaseException:  # a worker failed, or Ctrl-C
            with handover:
                abandoned = True
            raise
        if error:
            raise error[0]

    def collective_rpc(self, method: str, *args: Any) -> Any:
        """Call `method` on every rank's runner; returns rank 0's result."""
        if self._failure is not None:
            raise RuntimeError(self._failure)
        self._check_workers()
        sent = (self._encoder.encode(*args),) if method == "execute" and self.workers else args
        try:
            # Inside: a Ctrl-C (or a dead worker's pipe) while handing the call out can leave a
            # worker running a call that rank 0 then never runs, out of step as below.
            for _, pipe in self.workers:
                pipe.send((method, *sent))
            result = getattr(self.runner, method)(*args)
        except BaseException as e:
            if not self.workers:
                raise
            try:
                self._check_workers()
            except WorkerFailed as failed:
                # Every rank runs the same code: a worker that failed with rank 0's own error
                # adds nothing, and whichever reported first, the caller sees that error's type.
                if not failed.raised(e):
                    raise
            self._stop_out_of_step(method, e)
            raise
        if method in _ANSWERED:
            for rank in range(1, len(self.workers) + 1):
                self._answer(rank)
        self._check_workers()
        return result

    def _answer(self, rank: int, starting: bool = False) -> Any:
        """Wait for worker `rank`'s answer, failing as soon as it fails or dies (`starting`: the
        answer is its first, sent once its process has imported what it runs)."""
        proc, pipe = self.workers[rank - 1]
        while not pipe.poll(1.0):
            if not proc.is_alive():
                self._fail(rank, starting)
        return self._receive(rank)

    def workers_alive(self) -> bool:
        """Whether every worker process still runs and the ranks are in step (a dead one's
        sentinel is ready; nothing is reaped, so any thread may ask)."""
        workers = self.workers  # held: shutdown drops the list, whose processes close their fds
        return self._failure is None and not mp_connection.wait(
            [proc.sentinel for proc, _ in workers], timeout=0
        )

    def _check_workers(self) -> None:
        for rank, (proc, pipe) in enumerate(self.workers, start=1):
            if pipe.poll():
                self._receive(rank)  # unasked, only an error (or the end of a dead pipe) comes
            if not proc.is_alive():
                self._fail(rank)

    def _receive(self, rank: int) -> Any:
        try:
            status, payload = self.workers[rank - 1][1].recv()
        except (EOFError, OSError):
            # poll() also reports a pipe whose other end closed: the worker is gone.
            self._fail(rank)
        if status != "ok":
            raise WorkerFailed(rank, payload)
        return payload

    def _fail(self, rank: int, starting: bool = False) -> NoReturn:
        proc = self.workers[rank - 1][0]
        # Its pipe may close a moment before the process is reaped; wait for the exit code.
        proc.join(timeout=5)
        if starting:
            # Nothing of the engine ran there yet. Exit code 1 is a Python error, which the worker
            # printed itself: in importing the main script or its modules.
            printed = " (its error is printed above)" if proc.exitcode == 1 else ""
            hint = f" One cause: {_GUARD_HINT}" if proc.exitcode == 1 else ""
            raise RuntimeError(
                f"tensor-parallel worker {rank} exited while starting (exit code "
                f"{proc.exitcode}), before it ran any engine code{printed}.{hint}"
            )
        raise RuntimeError(
            f"tensor-parallel worker {rank} died (exit code {proc.exitcode}); the engine cannot "
            "continue"
        )

    def _stop_out_of_step(self, method: str, error: BaseException) -> None:
        """Rank 0 left `method` early (an exception, Ctrl-C) while the workers run it: they wait
        in collectives that rank 0's next call would answer with mismatched ones (a hang until
        the collective timeout, an abort, or wrong results where the shapes happen to match).
        Nothing can bring the ranks back in step: stop the workers now and refuse later calls."""
        self._failure = (
            f"the tensor-parallel engine stopped: rank 0 raised {type(error).__name__} during "
            f"{method!r} ({error}), leaving its workers out of step; build a new engine"
        )
        self._release(wait_s=0.0)
        if sys.version_info >= (3, 11):  # notes came with 3.11; the package supports 3.10
            error.add_note("tensor-parallel workers stopped: the engine cannot continue")

    def shutdown(self) -> None:
        # Before rank 0 joined the group (start-up stopped: Ctrl-C, SIGTERM, an error), every
        # worker is still starting, with nothing to wind down, and none reads "shutdown" before
        # joining: killed at once rather than after the whole wait.
        self._release(_SHUTDOWN_WAIT_S if self._owns_group else 0.0)

    def _release(self, wait_s: float) -> None:
        """Stop the workers (killing those still running after `wait_s`, one wait for all) and
        destroy the process group if this executor created it."""
        for proc, pipe in self.workers:
            if proc.is_alive():
                try:
                    pipe.send(("shutdown",))
                except OSError:
                    pass
        # One deadline for all: a worker still waiting to join the group (stopped during start-up)
        # never reads "shutdown", and each would otherwise add its own wait.
        deadline = time.monotonic() + wait_s
        for proc, _ in self.workers:
            proc.join(timeout=max(0.0, deadline - time.monotonic()))
            if proc.is_alive():
                proc.kill()
                proc.join()
        self.workers = []
        if self._exit_hook is not None:
            atexit.unregister(self._exit_hook)
            self._exit_hook = None
        # Only its own group: shutting down again (an `LLM` collected after `shutdown()`) must not
        # tear down the group of an engine built since, which would silently turn its
        # collectives into no-ops on rank 0.
        if self._owns_group:
            self._owns_group = False
            destroy_model_parallel()
            dist.destroy_process_group()
        if self._saved_threads is not None:
            torch.set_num_threads(self._saved_threads)
            self._saved_threads = None
