"""Tensor parallelism through the engine: `LLM(..., tensor_parallel_size=2)` spawns one gloo worker
on CPU (torch reference kernels, inherited through the environment).

- TP=2 gives the TP=1 greedy tokens on the built-in tiny models and on a checkpoint saved by
  transformers' `save_pretrained`; a quantization config's `ignore` pattern that matches no layer
  is warned about once (by rank 0), not once a rank;
- a worker that is killed (idle or in the middle of a generation) or that raises fails the engine
  with a RuntimeError naming it, in bounded time; so does one that dies before joining the group;
- shutdown (explicit or when the `LLM` is collected) leaves no worker process behind and leaves a
  newer engine's process group alone; no other engine starts beside a live TP engine;
- a worker whose rank 0 is killed outright ends within seconds, even when busy; a script that
  never shuts its TP engine down still exits;
- with asynchronous scheduling, steps launched ahead (no input ids: the worker takes rank 0's
  sampled ids from a broadcast) give the TP=1 greedy tokens;
- the ranks share the CPU's cores (`rank_cpu_threads`), and rank 0 gets its own thread count
  back at shutdown.
"""

import contextlib
import functools
import gc
import io
import logging
import multiprocessing
import multiprocessing.connection
import multiprocessing.context
import os
import select
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from hf_kimi_linear import import_modeling_kimi_linear, random_hf_model

from vllm import LLM, SamplingParams
from vllm.engine.arg_utils import EngineArgs
from vllm.v1.core.kv_cache_utils import CacheSizeError
from vllm.v1.engine.llm_engine import LLMEngine
from vllm.v1.executor.multiproc_executor import (
    _ANSWERED,
    Executor,
    WorkerFailed,
    rank_cpu_threads,
    tcp_store,
)
from vllm.v1.executor.step_message import StepMessage
from vllm.v1.worker.model_runner import StepInput

pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="the gloo engine runs on CPU")

# The failure and shutdown tests need any TP model: the faster of the two.
FAST = "kimi-linear-tiny"
ARGS = dict(max_model_len=64, max_num_seqs=4, kv_cache_memory=32 << 20)
PROMPTS = [[5, 6, 7], [40, 41, 42, 43, 44, 45, 46, 47, 48, 49, 50], [90, 91, 92, 93, 94, 95]]
GREEDY = SamplingParams(temperature=0.0, max_tokens=5, ignore_eos=True)
# Keeps every linear layer in bf16 (so the tokens stay TP=1's), with a pattern naming no layer.
KEEP_BF16_WITH_STRAY_IGNORE = {"linear": "fp8_per_channel", "ignore": ["re:.*", "no.such.layer"]}
UNMATCHED_IGNORE_WARNING = "pattern(s) match no linear layer of the model"
# Far above a step's time on a loaded CPU, far below the 10-minute collective timeout.
BOUND_S = 60.0


@pytest.fixture(scope="module", autouse=True)
def reference_kernels(torch_reference_kernels):
    """Whole models over many steps: run the torch references, not interpreted Triton."""


def worker_processes(llm: LLM) -> list[multiprocessing.Process]:
    return [proc for proc, _ in llm.llm_engine.executor.workers]


def assert_no_workers_left(pids: list[int]) -> None:
    assert multiprocessing.active_children() == []
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)  # reaped, not a zombie either


def greedy_tokens(
    model: str, tp: int, steps: list[StepInput] | None = None, **kwargs
) -> list[list[int]]:
    """The greedy tokens of `PROMPTS` at TP = `tp`; rank 0's step inputs go into `steps`."""
    llm = LLM(model, tensor_parallel_size=tp, **ARGS, **kwargs)
    try:
        assert len(worker_processes(llm)) == tp - 1
        pids = [proc.pid for proc in worker_processes(llm)]
        if steps is not None:
            runner = llm.llm_engine.executor.runner
            execute = runner.execute

            def recorded(step: StepInput) -> torch.Tensor:
                steps.append(step)
                return execute(step)

            runner.execute = recorded
        outputs = llm.generate(PROMPTS, GREEDY, use_tqdm=False)
    finally:
        llm.shutdown()
    assert_no_workers_left(pids)
    return [list(out.outputs[0].token_ids) for out in outputs]


@functools.cache
def tp1_tokens(model: str) -> list[list[int]]:
    return greedy_tokens(model, 1)


@pytest.mark.parametrize("model", ["kimi-k3-tiny", "kimi-linear-tiny"])
def test_tp2_gives_the_tp1_greedy_tokens_on_builtin_models(model, capfd, monkeypatch):
    """Also: each rank builds the model and finds the stray `ignore` pattern matching nothing,
    and it is warned about once in all (in rank 0's log)."""
    assert all(len(tokens) == GREEDY.max_tokens for tokens in tp1_tokens(model))
    # Rank 0 logs through the `vllm` stream handler, here into `rank0`; the worker writes to the
    # stderr it inherits (file descriptor 2, which capfd reads). Both at INFO, whatever the
    # suite's level, so that the worker says something there.
    monkeypatch.setenv("VLLM_LOGGING_LEVEL", "INFO")
    vllm_logger = logging.getLogger("vllm")
    (handler,) = [h for h in vllm_logger.handlers if type(h) is logging.StreamHandler]
    capfd.readouterr()
    stream, level = handler.setStream(rank0 := io.StringIO()), vllm_logger.level
    vllm_logger.setLevel(logging.INFO)
    try:
        tokens = greedy_tokens(model, 2, quantization_config=KEEP_BF16_WITH_STRAY_IGNORE)
    finally:
        handler.setStream(stream)
        vllm_logger.setLevel(level)
    assert tokens == tp1_tokens(model)
    workers = capfd.readouterr().err
    assert "Loaded " in workers, workers  # the worker's output is read here
    assert UNMATCHED_IGNORE_WARNING not in workers, workers
    assert rank0.getvalue().count(UNMATCHED_IGNORE_WARNING) == 1, rank0.getvalue()


def test_tp2_launches_steps_ahead_and_keeps_the_tp1_greedy_tokens():
    """Asynchronous scheduling at TP = 2: a step launched ahead carries no input ids (only rank 0
    samples), so the worker takes them from rank 0's broadcast; the tokens are TP = 1's, one
    step at a time."""
    steps: list[StepInput] = []
    tokens = greedy_tokens(FAST, 2, steps, async_scheduling=True)
    assert sum(step.input_ids is None for step in steps) >= GREEDY.max_tokens - 2
    assert tokens == tp1_tokens(FAST)


def test_every_start_up_call_is_answered(monkeypatch):
    """Rank 0 waits for the workers' answer to each start-up call (`_ANSWERED`): the next call
    starts after it, and a worker's failure is blamed on the call that failed. Every method the
    engine's start sends is one of them."""
    sent = []
    rpc = Executor.collective_rpc

    def recorded(self, method, *args):
        sent.append(method)
        return rpc(self, method, *args)

    monkeypatch.setattr(Executor, "collective_rpc", recorded)
    LLMEngine.from_engine_args(EngineArgs(model=FAST, **ARGS)).shutdown()
    assert "warm_up_prefill_steps" in sent and set(sent) <= _ANSWERED


@pytest.mark.parametrize("cores, tp, threads", [(2, 2, 1), (16, 2, 8), (1, 4, 1), (6, 4, 1)])
def test_each_rank_takes_its_share_of_the_cores(cores, tp, threads, monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(cores)))
    assert rank_cpu_threads(tp) == threads
    monkeypatch.setenv("OMP_NUM_THREADS", "")  # OpenMP ignores it: torch's default again
    assert rank_cpu_threads(tp) == threads
    monkeypatch.setenv("OMP_NUM_THREADS", "3")  # the user's choice, inherited by every rank
    assert rank_cpu_threads(tp) is None


def test_a_cpu_tp_engine_shares_the_cores_and_gives_rank0_its_threads_back(monkeypatch):
    """At torch's default every rank ran a thread per core, oversubscribing the cores (about 4x
    slower at TP = 2 on 2 cores)."""
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    before = torch.get_num_threads()
    share = rank_cpu_threads(2)
    torch.set_num_threads(share + 1)  # any count but the share
    try:
        llm = LLM(FAST, tensor_parallel_size=2, **ARGS)
        try:
            assert torch.get_num_threads() == share
            llm.generate(PROMPTS[:1], GREEDY, use_tqdm=False)
        finally:
            llm.shutdown()
        assert torch.get_num_threads() == share + 1
    finally:
        torch.set_num_threads(before)


@pytest.fixture(scope="module")
def hf_checkpoint(tmp_path_factory) -> Path:
    """A random tiny Kimi-Linear saved by transformers, with the built-in models' vocabulary (so
    that their byte-level tokenizer fits it)."""
    pytest.importorskip("transformers")
    model = random_hf_model(
        import_modeling_kimi_linear(), vocab_size=320, bos_token_id=256, eos_token_id=257,
        pad_token_id=258,
    )  # fmt: skip
    folder = tmp_path_factory.mktemp("hf_kimi_linear")
    model.save_pretrained(folder)
    return folder


def test_tp2_gives_the_tp1_greedy_tokens_on_a_transformers_checkpoint(hf_checkpoint):
    tp1 = greedy_tokens(str(hf_checkpoint), 1, tokenizer="kimi-linear-tiny")
    assert greedy_tokens(str(hf_checkpoint), 2, tokenizer="kimi-linear-tiny") == tp1


def generate_in_thread(llm: LLM, params: SamplingParams) -> BaseException | None:
    """Run `llm.generate` with a deadline; returns what it raised (None if it returned). Fails
    the test if it is still running after BOUND_S (a hang)."""
    raised: list[BaseException] = []

    def run() -> None:
        try:
            llm.generate(PROMPTS, params, use_tqdm=False)
        except BaseException as e:  # noqa: BLE001 - handed to the test thread
            raised.append(e)

    thread = threading.Thread(target=run, daemon=True)
    start = time.monotonic()
    thread.start()
    thread.join(BOUND_S)
    assert not thread.is_alive(), f"generate still running after {BOUND_S} s"
    assert time.monotonic() - start < BOUND_S
    return raised[0] if raised else None


@pytest.fixture
def tp2_llm():
    llm = LLM(FAST, tensor_parallel_size=2, **ARGS)
    pids = [proc.pid for proc in worker_processes(llm)]
    yield llm
    llm.shutdown()
    assert_no_workers_left(pids)


def test_a_started_worker_ignores_the_group_signals_without_blocking_them(tp2_llm):
    """Blocked from the spawn, then ignored: what a worker starts (a compiler) inherits them
    ignored, as before, not blocked."""
    (worker,) = worker_processes(tp2_llm)
    status = Path(f"/proc/{worker.pid}/status").read_text()
    fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
    bits = [1 << (sig - 1) for sig in (signal.SIGINT, signal.SIGTERM)]
    assert all(int(fields["SigIgn"], 16) & bit for bit in bits)
    assert not any(int(fields["SigBlk"], 16) & bit for bit in bits)


def test_worker_killed_while_idle_fails_the_next_generate(tp2_llm):
    assert generate_in_thread(tp2_llm, GREEDY) is None
    (worker,) = worker_processes(tp2_llm)
    os.kill(worker.pid, signal.SIGKILL)
    worker.join()
    error = generate_in_thread(tp2_llm, GREEDY)
    assert isinstance(error, RuntimeError)
    assert "tensor-parallel worker 1 died" in str(error)
    # The failed generate left nothing queued.
    assert not tp2_llm.llm_engine.has_unfinished_requests()


def test_worker_killed_mid_generation_fails_the_engine(tp2_llm):
    (worker,) = worker_processes(tp2_llm)
    engine = tp2_llm.llm_engine
    step = engine.step
    steps = []

    def step_then_kill():
        steps.append(1)
        if len(steps) == 3:
            # Killed while rank 0 runs the step, so rank 0 usually meets the death inside a
            # collective (or, if it lands between steps, at its next check of the workers).
            threading.Timer(0.05, os.kill, (worker.pid, signal.SIGKILL)).start()
        elif len(steps) > 3:
            # A fast machine could finish every step before the timer fires: later steps start
            # only once the worker is dead (its sentinel, which reaps nothing, is then ready).
            multiprocessing.connection.wait([worker.sentinel], timeout=30)
        return step()

    engine.step = step_then_kill
    error = generate_in_thread(tp2_llm, SamplingParams(temperature=0.0, max_tokens=50))
    assert isinstance(error, RuntimeError)
    assert "tensor-parallel worker 1 died" in str(error)
    assert len(steps) >= 3


def test_worker_raising_fails_the_engine_with_its_traceback(tp2_llm):
    (_, pipe) = tp2_llm.llm_engine.executor.workers[0]
    # Only the worker runs this bad step, then the real ones: it raises while rank 0 proceeds.
    pipe.send(("execute", StepMessage([10**6], 0, [], [], [], [], [])))
    error = generate_in_thread(tp2_llm, GREEDY)
    assert isinstance(error, RuntimeError)
    assert "tensor-parallel worker 1 failed" in str(error)
    assert "token ids outside the vocabulary" in str(error)


@pytest.mark.parametrize("error", [ValueError, KeyboardInterrupt])
def test_rank0_raising_mid_step_stops_the_workers_it_left_behind(monkeypatch, error):
    """Rank 0 leaves a step inside the model (an exception, Ctrl-C) while the worker runs it: the
    worker waits in a collective that rank 0's next step would answer with a mismatched one (a
    hang until the collective timeout, an abort, or wrong tokens). The engine stops its workers
    at once, refuses later steps with a clear error and frees the group for a new engine."""
    expected = tp1_tokens(FAST)
    llm = LLM(FAST, tensor_parallel_size=2, **ARGS)
    pids = [proc.pid for proc in worker_processes(llm)]
    layer = llm.llm_engine.executor.runner.model.layers[1]
    forward, calls = layer.forward, []

    def fail_second_call(*args, **kwargs):
        calls.append(1)
        if len(calls) == 2:  # the first decode step, after layer 0's collectives
            raise error("rank 0 failed")
        return forward(*args, **kwargs)

    monkeypatch.setattr(layer, "forward", fail_second_call)
    with pytest.raises(error, match="rank 0 failed") as raised:
        llm.generate(PROMPTS, GREEDY, use_tqdm=False)
    assert_no_workers_left(pids)
    if sys.version_info >= (3, 11):
        assert "tensor-parallel workers stopped" in raised.value.__notes__[-1]
    monkeypatch.undo()
    with pytest.raises(RuntimeError, match=f"rank 0 raised {error.__name__} during 'execute'"):
        llm.generate(PROMPTS, GREEDY, use_tqdm=False)
    # No shutdown() needed first: the failed engine no longer holds the process group.
    new = LLM(FAST, tensor_parallel_size=2, **ARGS)
    try:
        outputs = new.generate(PROMPTS, GREEDY, use_tqdm=False)
        assert [list(out.outputs[0].token_ids) for out in outputs] == expected
    finally:
        new.shutdown()
        llm.shutdown()


class _InterruptedAfterSecondStep:
    """A worker's pipe on which Ctrl-C lands just after the second step message went out."""

    def __init__(self, pipe) -> None:
        self.pipe, self.steps = pipe, 0

    def __getattr__(self, name):
        return getattr(self.pipe, name)

    def send(self, message) -> None:
        self.pipe.send(message)
        if message[0] == "execute":
            self.steps += 1
            if self.steps == 2:
                raise KeyboardInterrupt


def test_ctrl_c_while_sending_a_step_stops_the_workers_it_reached():
    """A Ctrl-C that lands while rank 0 hands a step to the workers, after a worker got it:
    that worker runs the step, whose collectives only rank 0's next step would answer. As for
    one during rank 0's forward, the workers are stopped and later steps refused."""
    llm = LLM(FAST, tensor_parallel_size=2, **ARGS)
    executor = llm.llm_engine.executor
    pids = [proc.pid for proc in worker_processes(llm)]
    (proc, pipe) = executor.workers[0]
    executor.workers[0] = (proc, _InterruptedAfterSecondStep(pipe))
    try:
        with pytest.raises(KeyboardInterrupt):
            llm.generate(PROMPTS, GREEDY, use_tqdm=False)
        assert_no_workers_left(pids)
        # Stopped out of step, the workers list is empty: /health must still say the engine
        # cannot serve.
        assert not llm.llm_engine.workers_alive()
        with pytest.raises(RuntimeError, match="rank 0 raised KeyboardInterrupt during 'execute'"):
            llm.generate(PROMPTS, GREEDY, use_tqdm=False)
    finally:
        llm.shutdown()
    assert_no_workers_left(pids)


def test_collecting_an_llm_stops_its_workers_and_spares_a_newer_engine():
    """Also: while a TP engine is alive, another engine in the process is refused at once."""
    expected = tp1_tokens(FAST)
    old = LLM(FAST, tensor_parallel_size=2, **ARGS)
    old_pids = [proc.pid for proc in worker_processes(old)]
    old.shutdown()
    new = LLM(FAST, tensor_parallel_size=2, **ARGS)
    new_pids = [proc.pid for proc in worker_processes(new)]
    # One TP group per process: another engine is refused before it builds or starts anything.
    for tp in (2, 1):
        with pytest.raises(RuntimeError, match="a tensor-parallel engine already runs"):
            LLM(FAST, tensor_parallel_size=tp, **ARGS)
    assert len(multiprocessing.active_children()) == 1
    # Collecting the old LLM shuts it down again: that must leave the new engine's group alone.
    del old
    gc.collect()
    outputs = new.generate(PROMPTS, GREEDY, use_tqdm=False)
    assert [list(out.outputs[0].token_ids) for out in outputs] == expected
    assert all(proc.is_alive() for proc in worker_processes(new))
    del new, outputs
    gc.collect()
    assert_no_workers_left(old_pids + new_pids)


def _run_script(folder: Path, source: str) -> subprocess.CompletedProcess:
    """Run `source` (dedented) as a script of its own in `folder`, within 2 * BOUND_S: start-up
    paths that only a fresh process shows (the workers re-import its main script)."""
    script = folder / "script.py"
    script.write_text(textwrap.dedent(source))
    start = time.monotonic()
    result = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=2 * BOUND_S,
        cwd=folder,
    )  # fmt: skip
    assert time.monotonic() - start < 2 * BOUND_S
    return result


def test_worker_dying_before_joining_fails_startup(tmp_path):
    """A script that builds a TP engine without the `__main__` guard: each spawned worker
    re-runs it and dies while bootstrapping, before joining the process group. Rank 0 must not
    wait for it at the rendezvous."""
    result = _run_script(
        tmp_path,
        f"""\
        from vllm import LLM

        LLM({FAST!r}, tensor_parallel_size=2, **{ARGS!r})
        """,
    )
    assert result.returncode != 0
    # The worker's own error and rank 0's name the guard (multiprocessing's talks of freezing).
    worker_error = "RuntimeError: this process (vllm-tp-worker-1, pid"
    assert worker_error in result.stderr, result.stderr[-3000:]
    assert "RuntimeError: tensor-parallel worker 1 exited while starting" in result.stderr
    assert result.stderr.count('under `if __name__ == "__main__":`') == 2


@pytest.mark.parametrize("how", ["raise", "exit"])
def test_worker_failing_after_it_started_but_before_joining_fails_startup(tmp_path, how):
    """A worker that fails (here: cannot join the group) or is killed after it reported
    "started" and before the group exists: rank 0 waited in the rendezvous for the collective
    timeout (10 minutes), deaf to Ctrl-C, the worker's error unread in its pipe."""
    result = _run_script(
        tmp_path,
        f"""\
        import multiprocessing
        import os

        if multiprocessing.current_process().name.startswith("vllm-tp-worker-"):
            from vllm.v1.executor import multiproc_executor

            def cannot_join(config, rank, store=None):
                if {how!r} == "exit":
                    os._exit(9)
                raise OSError("no route to the rendezvous store")

            multiproc_executor._init_distributed = cannot_join

        if __name__ == "__main__":
            from vllm import LLM

            LLM({FAST!r}, tensor_parallel_size=2, **{ARGS!r})
        """,
    )
    assert result.returncode != 0
    if how == "raise":
        expected = "WorkerFailed: tensor-parallel worker 1 failed"
        assert "OSError: no route to the rendezvous store" in result.stderr, result.stderr[-3000:]
    else:
        expected = "RuntimeError: tensor-parallel worker 1 died (exit code 9)"
    assert expected in result.stderr, result.stderr[-3000:]


def _running(pid: int) -> bool:
    """Whether process `pid` exists and is not a zombie (an orphan's zombie lingers where the
    container's init does not reap)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads process states in /proc")
@pytest.mark.parametrize("forked_helper", [False, True])
def test_a_worker_ends_when_rank0_is_killed_while_it_is_busy(tmp_path, forked_helper):
    """Rank 0 killed outright (SIGKILL, the out-of-memory killer) while its worker is busy, here
    held before the join: the worker went on until the collective timeout (10 minutes; on a GPU
    it held its memory all along). It must end within seconds, also when a process rank 0 forked
    after the spawn (holding the worker's parent sentinel open) lives on."""
    script = tmp_path / "script.py"
    script.write_text(
        textwrap.dedent(f"""\
        import multiprocessing
        import os
        import time

        if multiprocessing.current_process().name.startswith("vllm-tp-worker-"):
            from vllm.v1.executor import multiproc_executor

            def busy(config, rank, store=None):
                print("worker", os.getpid(), flush=True)
                time.sleep(600)

            multiproc_executor._init_distributed = busy

        def fork_a_helper():
            while not multiprocessing.active_children():
                time.sleep(0.05)
            if os.fork() == 0:
                print("helper", os.getpid(), flush=True)
                time.sleep(120)
                os._exit(0)

        if __name__ == "__main__":
            import threading

            from vllm import LLM

            if {forked_helper!r}:
                threading.Thread(target=fork_a_helper, daemon=True).start()
            LLM({FAST!r}, tensor_parallel_size=2, **{ARGS!r})
        """)
    )
    log = tmp_path / "stderr.txt"
    with log.open("w") as err, subprocess.Popen(
        [sys.executable, str(script)], stdout=subprocess.PIPE, stderr=err, text=True,
        cwd=tmp_path, start_new_session=True,
    ) as rank0:  # fmt: skip
        try:
            pids = {}
            while len(pids) < 1 + forked_helper:
                ready, _, _ = select.select([rank0.stdout], [], [], 2 * BOUND_S)
                assert ready, f"no pid reported:\n{log.read_text()[-3000:]}"
                words = rank0.stdout.readline().split()
                assert words[:1] in (["worker"], ["helper"]), f"{words}\n{log.read_text()[-3000:]}"
                pids[words[0]] = int(words[1])
            worker = pids["worker"]
            rank0.kill()
            rank0.wait()
            deadline = time.monotonic() + 15.0
            while _running(worker) and time.monotonic() < deadline:
                time.sleep(0.1)
            assert not _running(worker), "the worker outlived its killed rank 0"
        finally:
            # Rank 0's session holds its worker too: nothing outlives a failure above.
            with contextlib.suppress(ProcessLookupError):
                os.killpg(rank0.pid, signal.SIGKILL)
            rank0.wait()


def test_a_script_that_never_shuts_its_engine_down_exits(tmp_path):
    """multiprocessing's exit handler sends the daemon workers SIGTERM, which they ignore, then
    joins them without a timeout: such a script hung at exit until killed."""
    result = _run_script(
        tmp_path,
        f"""\
        from vllm import LLM, SamplingParams

        if __name__ == "__main__":
            llm = LLM({FAST!r}, tensor_parallel_size=2, **{ARGS!r})
            out = llm.generate([[5, 6, 7]], SamplingParams(max_tokens=2), use_tqdm=False)
            print("generated", len(out[0].outputs[0].token_ids))
        """,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.splitlines() == ["generated 2"], result.stdout


def test_a_start_up_failed_after_the_join_leaves_no_group_behind(tmp_path):
    """A worker whose runner fails right after the group formed (as every rank's does for a
    model that cannot be built): the failed start-up must leave the process without a group,
    or every later engine there is refused as a second TP engine."""
    result = _run_script(
        tmp_path,
        f"""\
        import multiprocessing

        if multiprocessing.current_process().name.startswith("vllm-tp-worker-"):
            from vllm.v1.executor import multiproc_executor

            def no_runner(config, rank):
                raise OSError("the worker's runner cannot be built")

            multiproc_executor.ModelRunner = no_runner

        if __name__ == "__main__":
            import torch.distributed as dist

            from vllm import LLM

            try:
                LLM({FAST!r}, tensor_parallel_size=2, **{ARGS!r})
            except Exception as e:
                print("failed:", type(e).__name__)
            print("group left:", dist.is_initialized())
            LLM({FAST!r}, **{ARGS!r})
            print("next engine built")
        """,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.splitlines() == [
        "failed: WorkerFailed", "group left: False", "next engine built"
    ], result.stdout  # fmt: skip


def test_a_worker_that_died_while_idle_is_seen_before_the_next_request():
    """/health asks `AsyncLLM.is_running`, which asked only whether the engine's loop thread
    ran: a worker killed while no request ran left it at 200 until a request failed on it."""
    from vllm.v1.engine.async_llm import AsyncLLM

    llm = LLM(FAST, tensor_parallel_size=2, skip_tokenizer_init=True, **ARGS)
    engine = AsyncLLM(llm.llm_engine)
    try:
        assert llm.llm_engine.workers_alive() and engine.is_running
        (worker,) = worker_processes(llm)
        os.kill(worker.pid, signal.SIGKILL)
        worker.join(timeout=BOUND_S)
        assert not llm.llm_engine.workers_alive()
        assert not engine.is_running
    finally:
        engine.shutdown()
        del llm
        gc.collect()


class _FailingWorker:
    """A worker (process and pipe) that fails the first call it is sent with `error`: it sends
    the traceback and exits."""

    def __init__(self, error: str) -> None:
        self.error, self.sent = error, []

    def is_alive(self) -> bool:
        return not self.sent

    def poll(self, timeout: float = 0.0) -> bool:
        return bool(self.sent)

    def recv(self):
        return self.sent.pop(0)

    def send(self, message) -> None:
        self.sent.append(("error", f"Traceback (most recent call last):\n  ...\n{self.error}\n"))

    def join(self, timeout: float) -> None:
        pass


_CACHE = "vllm.v1.core.kv_cache_utils.CacheSizeError"


class _MultiLine(ValueError):
    """An error type outside builtins whose messages span lines."""


@pytest.mark.parametrize(
    "error, worker_error, raised",
    [
        (ValueError, "ValueError: 4 heads do not split over TP 3", ValueError),  # the same
        (ValueError, "ValueError: something else", WorkerFailed),
        (ValueError, "KeyError: 'x'", WorkerFailed),
        # Types outside builtins are written with their module (`vllm serve` maps this one to
        # its exit 2; a worker's copy of it had hidden it behind WorkerFailed).
        (CacheSizeError, f"{_CACHE}: 4 heads do not split over TP 3", CacheSizeError),
        (CacheSizeError, "CacheSizeError: 4 heads do not split over TP 3", WorkerFailed),
        (ValueError, f"{_CACHE}: 4 heads do not split over TP 3", WorkerFailed),
        # The whole message and the notes are compared, not the last line alone.
        (ValueError, "ValueError: 4 heads do not split over TP 3\nsee the log", ValueError),
        (ValueError, "KeyError: 'x'\nsee the log", WorkerFailed),
        (_MultiLine, f"{__name__}._MultiLine: bad A\nsee the docs", _MultiLine),
        (_MultiLine, f"{__name__}._MultiLine: bad B\nsee the docs", WorkerFailed),
    ],
)
def test_rank0_error_wins_over_the_same_error_from_a_worker(error, worker_error, raised):
    # Whichever reports first (a worker, here), a failure every rank shares keeps rank 0's own
    # exception type; a different worker failure is the engine's error.
    class Runner:
        def load_model(self):
            if error is _MultiLine:
                raise error("bad A\nsee the docs")
            e = error("4 heads do not split over TP 3")
            if worker_error.endswith("see the log"):
                e.add_note("see the log")
            raise e

    executor = object.__new__(Executor)
    executor._failure, executor._owns_group = None, False
    worker = _FailingWorker(worker_error)
    executor.workers = [(worker, worker)]
    executor.runner = Runner()
    with pytest.raises(raised) as info:
        executor.collective_rpc("load_model")
    if raised is WorkerFailed:
        assert "tensor-parallel worker 1 failed" in str(info.value)
        assert worker_error in str(info.value)


@pytest.mark.parametrize(("env", "libuv"), [(None, True), ("1", True), ("0", False)])
def test_rendezvous_store_follows_use_libuv(monkeypatch, env, libuv):
    """As torch's own tcp:// rendezvous: libuv unless USE_LIBUV=0 (a user's way around it)."""
    if env is None:
        monkeypatch.delenv("USE_LIBUV", raising=False)
    else:
        monkeypatch.setenv("USE_LIBUV", env)
    store = tcp_store("127.0.0.1", 0, 1, is_master=True)
    assert store.libuvBackend is libuv and store.port > 0


def test_shutdown_waits_once_for_all_workers_that_never_answer(monkeypatch):
    """Workers stopped during start-up (still joining the group) never read "shutdown": they are
    killed after one wait in all, not one wait each."""
    import multiprocessing as mp
    import time

    from vllm.v1.executor import multiproc_executor

    monkeypatch.setattr(multiproc_executor, "_SHUTDOWN_WAIT_S", 1.0)
    context = mp.get_context("fork")
    # A shutdown once the group exists (the group's teardown stubbed: there is none here);
    # shutdown() before that kills at once (the next test).
    torn_down = []
    monkeypatch.setattr(multiproc_executor, "destroy_model_parallel", lambda: None)
    monkeypatch.setattr(
        multiproc_executor.dist, "destroy_process_group", lambda: torn_down.append(True)
    )
    executor = object.__new__(multiproc_executor.Executor)
    executor._owns_group = True
    executor.workers = []
    for _ in range(3):
        parent, child = context.Pipe()
        proc = context.Process(target=time.sleep, args=(60,), daemon=True)
        proc.start()
        executor.workers.append((proc, parent))
    procs = [proc for proc, _ in executor.workers]
    start = time.monotonic()
    executor.shutdown()
    elapsed = time.monotonic() - start
    assert 0.9 < elapsed < 2.5  # one wait of 1 s: none would kill at once, one each take 3 s
    assert not any(proc.is_alive() for proc in procs)
    assert torn_down == [True]


@pytest.mark.parametrize("abandoned", [False, True])
def test_the_group_goes_to_the_executor_only_if_start_up_still_waits(monkeypatch, abandoned):
    """The rendezvous thread hands the joined group to the executor (whose shutdown destroys it),
    unless start-up was given up while it joined (a worker failed, Ctrl-C): then the thread
    destroys the group itself, so that no group is left to refuse the process's next engine."""
    from vllm.v1.executor import multiproc_executor

    joining, join_may_end, torn_down, joiners = threading.Event(), threading.Event(), [], []

    def slow_join(config, rank, store):
        joiners.append(threading.current_thread())
        joining.set()
        assert join_may_end.wait(30)

    monkeypatch.setattr(multiproc_executor, "_init_distributed", slow_join)
    monkeypatch.setattr(multiproc_executor, "destroy_model_parallel", lambda: torn_down.append(1))
    monkeypatch.setattr(
        multiproc_executor.dist, "destroy_process_group", lambda: torn_down.append(2)
    )
    executor = object.__new__(multiproc_executor.Executor)
    executor._owns_group = False

    def check_workers():
        assert joining.wait(30)
        if abandoned:
            raise RuntimeError("worker 1 failed")
        join_may_end.set()

    executor._check_workers = check_workers
    if abandoned:
        with pytest.raises(RuntimeError, match="worker 1 failed"):
            executor._join_group(None, None)
        join_may_end.set()  # the join completes after start-up gave up
        [thread] = joiners
        thread.join(30)
        assert torn_down == [1, 2] and not executor._owns_group
    else:
        executor._join_group(None, None)
        assert torn_down == [] and executor._owns_group


def _group_signals_kept_out(pid: int) -> bool:
    """Whether process `pid` (its main thread) blocks or ignores SIGINT and SIGTERM (its SigBlk
    and SigIgn masks in /proc): no Ctrl-C can reach its Python code."""
    status = Path(f"/proc/{pid}/status").read_text()
    fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
    mask = int(fields["SigBlk"], 16) | int(fields["SigIgn"], 16)
    return all(mask & (1 << (sig - 1)) for sig in (signal.SIGINT, signal.SIGTERM))


def test_a_signal_to_rank_0_while_a_worker_is_spawned_is_delivered_after():
    """The spawn holds SIGINT and SIGTERM back so that the worker starts without them; one
    that reached rank 0 in that instant was lost (they were ignored, not blocked), so a
    SIGTERM to the server then went unanswered."""
    from vllm.v1.executor.multiproc_executor import _group_signals_deferred

    got = []
    previous = signal.signal(signal.SIGTERM, lambda sig, frame: got.append(sig))
    try:
        with _group_signals_deferred():
            for _ in range(2):  # to this thread, which blocks it, and to the process
                signal.pthread_kill(threading.get_ident(), signal.SIGTERM)
                os.kill(os.getpid(), signal.SIGTERM)
                time.sleep(0.05)
            assert got == []  # held while the worker is spawned
        assert got == [signal.SIGTERM]  # delivered once the spawn is done
        assert signal.SIGTERM not in signal.pthread_sigmask(signal.SIG_BLOCK, [])
    finally:
        signal.signal(signal.SIGTERM, previous)


@pytest.fixture
def dummy_tp2_config():
    """The fast model at TP = 2 with random weights and no tokenizer: enough for an executor
    that is stopped while its worker starts."""
    return EngineArgs(FAST, tensor_parallel_size=2, skip_tokenizer_init=True,
                      load_format="dummy", **ARGS).create_engine_config()  # fmt: skip


def after_each_spawn(
    monkeypatch: pytest.MonkeyPatch, then: Callable[[multiprocessing.context.SpawnProcess], None]
) -> None:
    """Runs `then(worker)` in rank 0 as soon as each worker process it spawns has started."""
    start = multiprocessing.context.SpawnProcess.start

    def start_then(self):
        start(self)
        then(self)

    monkeypatch.setattr(multiprocessing.context.SpawnProcess, "start", start_then)


def test_ctrl_c_during_a_workers_spawn_stops_that_worker(monkeypatch, dummy_tp2_config):
    """The interrupt comes after the spawned worker is in the executor's list, so the start-up
    failure stops it; raised inside `Process.start` (a thread of the process took the signal),
    it left the worker running, untracked."""
    spawned = []

    def ctrl_c(worker):
        spawned.append(worker)
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.2)  # time for whichever thread takes it

    after_each_spawn(monkeypatch, ctrl_c)
    with pytest.raises(KeyboardInterrupt):
        Executor(dummy_tp2_config)
    [worker] = spawned
    worker.join(BOUND_S)
    # Killed by the shutdown (an untracked worker died later, of a broken pipe, with a traceback).
    assert worker.exitcode == -signal.SIGKILL and multiprocessing.active_children() == []
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # restored


def test_ctrl_c_while_workers_start_is_quiet_and_quick(monkeypatch, dummy_tp2_config):
    """A Ctrl-C reaches the whole process group. A worker spawned by the executor keeps SIGINT
    out from its first instruction, not only once its imports are done (a KeyboardInterrupt
    traceback from inside an import otherwise), and rank 0 interrupted before the group exists
    kills the starting workers at once (none reads "shutdown" before joining the group; the
    10 s wait was spent in full)."""
    spawned = []

    def look(worker):
        spawned.append((worker, _group_signals_kept_out(worker.pid)))

    def interrupted(self, rank, starting=False):
        raise KeyboardInterrupt  # Ctrl-C while rank 0 waits for the workers to start

    after_each_spawn(monkeypatch, look)
    monkeypatch.setattr(Executor, "_answer", interrupted)
    sigterm = signal.getsignal(signal.SIGTERM)
    began = time.monotonic()
    with pytest.raises(KeyboardInterrupt):
        Executor(dummy_tp2_config)
    assert time.monotonic() - began < 5
    [(worker, ignored)] = spawned
    assert ignored and not worker.is_alive()
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # restored
    assert signal.getsignal(signal.SIGTERM) is sigterm
