"""Load and faults against a real `vllm serve kimi-k3-tiny`: 32 concurrent clients x 5 requests
of random lengths and parameters, a quarter cancelled mid-stream and an eighth malformed. No 5xx,
each malformed request a 400 naming its field, and afterwards the cache counters in /metrics back to
their initial values. Then tensor parallelism: a TP=2 (gloo) server of a checkpoint folder
answers the same greedy text as TP=1. Both are stopped with streams in flight, TP=1 by SIGTERM and
TP=2 by Ctrl-C (SIGINT to the process group, workers included): the streams end with a 503
"shutting down" event and `[DONE]`, the server exits 0 with no traceback and leaves no process
behind. A second signal once the engine is stopping ends the server at once, its workers killed."""

import asyncio
import collections
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import aiohttp
import pytest
import requests
from server_utils import RemoteServer

from vllm.model_executor.model_loader.builtin import resolve_model

SERVE = ["serve", "kimi-k3-tiny", "--max-model-len", "1024", "--seed", "0"]
CLIENTS, REQUESTS = 32, 5
WORDS = "the a of cat dog ran jumps over lazy quick brown fox 1 2 3 4 5 + = ? ! .".split()

# (body change, field the 400 must name)
MALFORMED = [
    ({"max_tokens": "ten"}, "max_tokens"),
    ({"temperature": -1}, "temperature"),
    ({"top_p": 2.0}, "top_p"),
    ({"n": 0}, "n"),
    ({"max_tokens": 5000}, "max_tokens"),
    ({"prompt": "x" * 1100}, "prompt"),
    ({"prompt": [5, 7, 99999]}, "prompt"),
    ({"stop": 12}, "stop"),
    ({"logprobs": "yes"}, "logprobs"),
    ({"model": 3}, "model"),
]


def _body(rng: random.Random) -> dict:
    prompt = " ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 40)))
    body = {"model": "kimi-k3-tiny", "prompt": prompt, "max_tokens": rng.randint(1, 24)}
    body["temperature"] = rng.choice([0.0, 0.7, 1.3])
    if rng.random() < 0.3:
        body["top_p"] = rng.uniform(0.5, 1.0)
    if rng.random() < 0.3:
        body["top_k"] = rng.randint(1, 50)
    if rng.random() < 0.3:
        body["seed"] = rng.randint(0, 1000)
    if rng.random() < 0.2:
        body["n"] = 2
    if rng.random() < 0.2:
        body["stop"] = [rng.choice(WORDS)]
    if rng.random() < 0.2:
        body["logprobs"] = rng.randint(0, 3)
    return body


async def _client(
    session: aiohttp.ClientSession, url: str, index: int, kinds: collections.Counter
) -> list[str]:
    """Run one client's requests, counting each kind sent in `kinds`; returns the problems seen
    (empty if all went right)."""
    rng = random.Random(1000 + index)
    problems = []
    for r in range(REQUESTS):
        body = _body(rng)
        # By position, so that exactly a quarter are cancelled and an eighth malformed, spread
        # over the clients and over time.
        slot = index * REQUESTS + r
        if slot % 8 == 2:
            kinds["malformed"] += 1
            change, param = MALFORMED[slot // 8 % len(MALFORMED)]  # each kind twice
            async with session.post(url, json={**body, **change}) as response:
                error = (await response.json()).get("error", {})
                if response.status != 400 or error.get("param") != param:
                    problems.append(f"malformed {change}: {response.status} {error}")
            continue
        if slot % 4 == 1:  # cancelled mid-stream
            kinds["cancelled"] += 1
            body.update(stream=True, max_tokens=rng.randint(20, 60))
            async with session.post(url, json=body) as response:
                if response.status != 200:
                    problems.append(f"stream {response.status}: {await response.text()}")
                    continue
                for _ in range(rng.randint(1, 3)):
                    await response.content.readline()
                response.close()  # drop the connection with the request unfinished
            continue
        body["stream"] = rng.random() < 0.3
        kinds["streamed" if body["stream"] else "whole"] += 1
        async with session.post(url, json=body) as response:
            text = await response.text()
            if response.status != 200:
                problems.append(f"{body}: {response.status} {text[:300]}")
            elif body["stream"] and not text.rstrip().endswith("data: [DONE]"):
                problems.append(f"stream without [DONE]: {text[-200:]}")
            elif not body["stream"]:
                reasons = {c["finish_reason"] for c in json.loads(text)["choices"]}
                if not reasons <= {"stop", "length"}:
                    problems.append(f"finish reasons {reasons}")
    return problems


async def _load(url: str) -> tuple[list[str], collections.Counter]:
    timeout = aiohttp.ClientTimeout(total=600)
    kinds: collections.Counter = collections.Counter()
    async with aiohttp.ClientSession(timeout=timeout) as session:
        clients = (_client(session, url, i, kinds) for i in range(CLIENTS))
        results = await asyncio.gather(*clients)
    return [p for problems in results for p in problems], kinds


def _metrics(server: RemoteServer) -> dict[str, float]:
    values: dict[str, float] = {}
    for line in requests.get(server.url("/metrics"), timeout=10).text.splitlines():
        if line and not line.startswith("#") and "{" in line:
            name = line.split("{", 1)[0]
            values[name] = values.get(name, 0.0) + float(line.rsplit(" ", 1)[1])
    return values


def _greedy(server: RemoteServer, prompts: list[str], headers: dict | None = None) -> list[str]:
    body = {"prompt": prompts, "max_tokens": 16, "temperature": 0}
    reply = requests.post(
        server.url("/v1/completions"), json=body, headers=headers, timeout=300
    ).json()
    return [c["text"] for c in sorted(reply["choices"], key=lambda c: c["index"])]


GREEDY_PROMPTS = ["Once upon a time", "Question: 7 * 6?\nAnswer:", "a b c d e f"]


def _stop_with_streams_in_flight(
    server: RemoteServer, sig: int, group: bool, headers: dict | None = None, streams: int = 3
) -> dict:
    """Open `streams` long streamed completions, send `sig` once each has its first chunk; returns
    each stream's last two events (or the exception that ended it), the server's log, exit code
    and leftover processes."""
    started = threading.Semaphore(0)
    tails: list = [None] * streams
    body = {"prompt": "hello", "max_tokens": 900, "ignore_eos": True, "stream": True}

    def read(i: int) -> None:
        events = []
        try:
            with requests.post(server.url("/v1/completions"), json=body, headers=headers,
                               stream=True, timeout=120) as response:  # fmt: skip
                for line in response.iter_lines():
                    if line:
                        if not events:
                            started.release()
                        events.append(line.decode())
            tails[i] = events[-2:]
        except requests.RequestException as e:
            tails[i] = e
        finally:
            if not events:
                started.release()

    threads = [threading.Thread(target=read, args=(i,)) for i in range(streams)]
    for thread in threads:
        thread.start()
    for _ in threads:
        assert started.acquire(timeout=120)
    server.stop(sig=sig, group=group)
    for thread in threads:
        thread.join(60)
    return {"tails": tails, "log": server.output(), "exit_code": server.exit_code,
            "leftover": server.leftover}  # fmt: skip


def test_a_second_ctrl_c_forces_a_quiet_exit() -> None:
    """uvicorn's forced exit on a second Ctrl-C skipped the app's lifespan shutdown, which ended
    cancelled and was logged as an ERROR traceback."""
    with RemoteServer(SERVE) as server:
        body = {"prompt": "hello", "max_tokens": 900, "ignore_eos": True, "stream": True}
        with requests.post(server.url("/v1/completions"), json=body, stream=True,
                           timeout=120) as response:  # fmt: skip
            next(response.iter_lines())  # streaming
            server.stop(sig=signal.SIGINT, times=2)
        log = server.output()
    assert server.exit_code == 0, log[-3000:]
    assert "Traceback" not in log and "CancelledError" not in log, log[-3000:]


def _is_tp_worker(pid: int) -> bool:
    try:
        return b"multiprocessing.spawn" in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_second_signal_during_shutdown_exits_at_once(sig: int) -> None:
    """Once the server stops its engine, a second Ctrl-C (or SIGTERM) ends it at once, with the
    shell's status for the signal, its workers killed. Here the worker cannot wind down (stopped,
    as one stuck in a collective would be), so the shutdown waits 10 s for it: the second SIGINT
    raised a KeyboardInterrupt out of that wait, and the interpreter's exit then waited for the
    worker all over again; a second SIGTERM killed the server and left the stopped worker."""
    name = signal.Signals(sig).name
    with RemoteServer([*SERVE, "-tp", "2"]) as server:
        (worker,) = [pid for pid in server.session_pids() if _is_tp_worker(pid)]
        os.kill(worker, signal.SIGSTOP)
        os.killpg(server.proc.pid, sig)  # as a terminal's Ctrl-C: the workers get it too
        deadline = time.monotonic() + 60
        while not re.search(r"\[api_server\.py:\d+\] Shutting down", server.output()):
            assert time.monotonic() < deadline, server.output()[-3000:]
            time.sleep(0.05)
        time.sleep(0.5)  # waiting for the worker
        start = time.monotonic()
        os.killpg(server.proc.pid, sig)
        exit_code = server.proc.wait(60)
        seconds = time.monotonic() - start
        server.stop()
        log = server.output()
    assert exit_code == 128 + sig, log[-3000:]
    assert seconds < 5, log[-3000:]
    said = f"{name} during shutdown: exiting now, without waiting for the engine to stop (1 "
    assert said + "tensor-parallel worker killed)" in log, log[-3000:]
    assert "Traceback" not in log, log[-3000:]
    assert server.leftover == []


# run_server with an engine whose start-up logging fails, and whose cleanup is interrupted by a
# Ctrl-C (the engine's shutdown sends it).
_FAILED_START = """
import argparse, os, signal
import vllm.entrypoints.cli.startup as startup
import vllm.v1.engine.llm_engine as llm_engine
from vllm.entrypoints.openai import api_server

class Engine:
    def __init__(self, config):
        pass

    def shutdown(self):
        os.kill(os.getpid(), signal.SIGINT)

def fail(*args):
    raise RuntimeError("the start-up failed here")

llm_engine.LLMEngine = Engine
startup.log_startup = fail
args = argparse.Namespace(host="127.0.0.1", port=0, served_model_name=None, model="m")
api_server.run_server(args, None)
"""


def test_a_signal_during_the_cleanup_of_a_failed_start_keeps_the_error() -> None:
    """Only a stop makes the next signal exit at once: after an error the signal interrupts the
    cleanup as any other, and the error is still reported (an exit at once dropped it)."""
    result = subprocess.run(
        [sys.executable, "-c", _FAILED_START], capture_output=True, text=True, timeout=120
    )
    assert "RuntimeError: the start-up failed here" in result.stderr, result.stderr[-3000:]
    assert "exiting now" not in result.stderr, result.stderr[-3000:]
    assert result.returncode != 0


def _assert_shut_down_cleanly(stopped: dict) -> None:
    for tail in stopped["tails"]:
        assert isinstance(tail, list), tail
        error = json.loads(tail[0].removeprefix("data: "))["error"]
        assert error["code"] == 503 and error["message"] == "the server is shutting down", error
        assert tail[1] == "data: [DONE]"
    log = stopped["log"]
    assert stopped["exit_code"] == 0, log[-3000:]
    assert "Traceback" not in log and "graceful shutdown exceeded" not in log, log[-3000:]
    assert stopped["leftover"] == []  # TP workers and multiprocessing helpers went down with it


@pytest.fixture(scope="module")
def tp1_greedy() -> dict:
    with RemoteServer(SERVE) as server:
        problems, kinds = asyncio.run(_load(server.url("/v1/completions")))
        deadline = time.monotonic() + 30
        while True:  # aborts of dropped streams land within a step or two
            metrics = _metrics(server)
            # All the counters at once: one reading's gauges may straddle an engine iteration.
            settled = (
                metrics["vllm:num_requests_running"] + metrics["vllm:num_requests_waiting"] == 0
                and metrics["vllm:num_free_blocks"] == metrics["vllm:initial_num_free_blocks"]
                and metrics["vllm:num_free_kda_slots"] == metrics["vllm:initial_num_free_kda_slots"]
            )
            if settled or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        greedy = _greedy(server, GREEDY_PROMPTS)
        healthy = requests.get(server.url("/health"), timeout=10).status_code
        stopped = _stop_with_streams_in_flight(server, signal.SIGTERM, group=False)
    return {"problems": problems, "kinds": kinds, "metrics": metrics, "greedy": greedy,
            "healthy": healthy, "stopped": stopped}  # fmt: skip


def test_load_with_cancellations_and_malformed_requests(tp1_greedy: dict) -> None:
    assert tp1_greedy["problems"] == []
    kinds = tp1_greedy["kinds"]
    assert sum(kinds.values()) == CLIENTS * REQUESTS
    assert (kinds["cancelled"], kinds["malformed"]) == (CLIENTS * REQUESTS // 4, 20), kinds
    assert tp1_greedy["healthy"] == 200
    metrics = tp1_greedy["metrics"]
    assert metrics["vllm:num_requests_running"] == metrics["vllm:num_requests_waiting"] == 0
    assert metrics["vllm:num_free_blocks"] == metrics["vllm:initial_num_free_blocks"]
    assert metrics["vllm:num_free_kda_slots"] == metrics["vllm:initial_num_free_kda_slots"]
    assert metrics["vllm:kv_cache_usage_perc"] == 0
    assert metrics["vllm:request_success_total"] > CLIENTS * REQUESTS / 2


def test_sigterm_with_streams_in_flight_shuts_down_cleanly(tp1_greedy: dict) -> None:
    _assert_shut_down_cleanly(tp1_greedy["stopped"])


def test_tp2_serves_the_same_greedy_text_and_stops_on_ctrl_c(
    tp1_greedy: dict, tmp_path: Path
) -> None:
    """TP=2 (gloo), serving a checkpoint folder (a copy of kimi-k3-tiny's, with the same dummy
    weights) with the remaining flags that work: each takes effect."""
    folder = tmp_path / "checkpoint"
    shutil.copytree(resolve_model("kimi-k3-tiny")[0], folder)
    key = {"Authorization": "Bearer sk-tp2"}
    flags = ["-tp", "2", "--no-enable-tokenizer-info-endpoint", "--uvicorn-log-level",
             "warning", "--enforce-eager", "--max-num-seqs", "16", "--max-num-batched-tokens",
             "256", "--dtype", "float32", "--load-format", "dummy",
             "--gpu-memory-utilization", "0.5"]  # fmt: skip
    argv = ["serve", str(folder), *SERVE[2:], *flags]
    with RemoteServer(argv, env={"VLLM_API_KEY": "sk-tp2"}) as server:
        assert _greedy(server, GREEDY_PROMPTS, key) == tp1_greedy["greedy"]
        models = requests.get(server.url("/v1/models"), headers=key, timeout=10).json()["data"]
        assert [(m["id"], m["root"]) for m in models] == [(str(folder), str(folder))]
        assert requests.post(server.url("/v1/completions"), json={"prompt": "a"}).status_code == 401
        assert requests.get(server.url("/tokenizer_info")).status_code == 404
        log = server.output()
        assert "TP=2" in log and "dtype float32" in log
        assert "max_num_seqs 16, max_num_batched_tokens 256" in log
        assert "CUDA graphs: off (--enforce-eager)" in log
        assert "Started server process" not in log  # uvicorn's info lines are off
        stopped = _stop_with_streams_in_flight(server, signal.SIGINT, group=True, headers=key)
    _assert_shut_down_cleanly(stopped)
