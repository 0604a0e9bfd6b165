"""Load and faults against a real `vllm serve kimi-k3-tiny`: 32 concurrent clients x 10 requests
of random lengths and parameters, a quarter cancelled mid-stream and a few malformed. No 5xx, each
malformed request a 400 naming its field, and afterwards the cache counters in /metrics back to
their initial values. Then tensor parallelism: a TP=2 (gloo) server answers the same greedy text
as TP=1, and both shut down without leaving processes behind."""

import asyncio
import json
import random

import aiohttp
import pytest
import requests
from server_utils import RemoteServer

SERVE = ["serve", "kimi-k3-tiny", "--max-model-len", "1024", "--seed", "0"]
CLIENTS, REQUESTS = 32, 10
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


async def _client(session: aiohttp.ClientSession, url: str, index: int) -> list[str]:
    """Run one client's requests; returns the problems seen (empty if all went right)."""
    rng = random.Random(1000 + index)
    problems = []
    for _ in range(REQUESTS):
        body = _body(rng)
        kind = rng.random()
        if kind < 0.1:
            change, param = rng.choice(MALFORMED)
            async with session.post(url, json={**body, **change}) as response:
                error = (await response.json()).get("error", {})
                if response.status != 400 or error.get("param") != param:
                    problems.append(f"malformed {change}: {response.status} {error}")
            continue
        if kind < 0.35:  # cancelled mid-stream
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


async def _load(url: str) -> list[str]:
    timeout = aiohttp.ClientTimeout(total=600)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        results = await asyncio.gather(*(_client(session, url, i) for i in range(CLIENTS)))
    return [p for problems in results for p in problems]


def _metrics(server: RemoteServer) -> dict[str, float]:
    values: dict[str, float] = {}
    for line in requests.get(server.url("/metrics"), timeout=10).text.splitlines():
        if line and not line.startswith("#") and "{" in line:
            name = line.split("{", 1)[0]
            values[name] = values.get(name, 0.0) + float(line.rsplit(" ", 1)[1])
    return values


def _greedy(server: RemoteServer, prompts: list[str]) -> list[str]:
    body = {"prompt": prompts, "max_tokens": 16, "temperature": 0}
    reply = requests.post(server.url("/v1/completions"), json=body, timeout=300).json()
    return [c["text"] for c in sorted(reply["choices"], key=lambda c: c["index"])]


GREEDY_PROMPTS = ["Once upon a time", "Question: 7 * 6?\nAnswer:", "a b c d e f"]


@pytest.fixture(scope="module")
def tp1_greedy() -> dict:
    with RemoteServer(SERVE) as server:
        problems = asyncio.run(_load(server.url("/v1/completions")))
        metrics = _metrics(server)
        for _ in range(100):  # aborts of dropped streams land within a step or two
            if metrics["vllm:num_requests_running"] + metrics["vllm:num_requests_waiting"] == 0:
                break
            metrics = _metrics(server)
        greedy = _greedy(server, GREEDY_PROMPTS)
        healthy = requests.get(server.url("/health"), timeout=10).status_code
    return {"problems": problems, "metrics": metrics, "greedy": greedy, "healthy": healthy,
            "exit_code": server.exit_code, "leftover": server.leftover}  # fmt: skip


def test_load_with_cancellations_and_malformed_requests(tp1_greedy: dict) -> None:
    assert tp1_greedy["problems"] == []
    assert tp1_greedy["healthy"] == 200
    metrics = tp1_greedy["metrics"]
    assert metrics["vllm:num_requests_running"] == metrics["vllm:num_requests_waiting"] == 0
    assert metrics["vllm:num_free_blocks"] == metrics["vllm:initial_num_free_blocks"]
    assert metrics["vllm:num_free_kda_slots"] == metrics["vllm:initial_num_free_kda_slots"]
    assert metrics["vllm:request_success_total"] > CLIENTS * REQUESTS / 2
    assert tp1_greedy["exit_code"] == 0 and tp1_greedy["leftover"] == []


def test_tp2_serves_the_same_greedy_text(tp1_greedy: dict) -> None:
    with RemoteServer([*SERVE, "-tp", "2"]) as server:
        assert _greedy(server, GREEDY_PROMPTS) == tp1_greedy["greedy"]
        assert "TP=2" in server.output()
    assert server.exit_code == 0, server.output()[-3000:]
    assert server.leftover == []  # the gloo worker went down with the server
