"""End to end: real `vllm serve kimi-k3-tiny` processes on CPU.

The official openai client (completion, streamed completion, chat, streamed chat, logprobs) with
greedy text equal to `LLM.generate` / `LLM.chat`; the tokenizer endpoints lm_eval probes; lm_eval
0.4.12 local-completions with the PR recipe's model_args on the local GSM8K-format task, with and
without the PTPC quantization config; a clean SIGTERM shutdown.
"""

import json
import subprocess
import sys
import time
from pathlib import Path

import openai
import pytest
import requests
from server_utils import ROOT, RemoteServer, server_env

from vllm.model_executor.model_loader.builtin import resolve_model
from vllm.transformers_utils.tokenizer import get_tokenizer

MODEL = "kimi-k3-tiny"
NAME = "moonshotai/Kimi-K3"
PTPC = '{"linear":"fp8_per_channel","ignore":["re:(?!.*self_attn\\\\.o_proj$).*"]}'
SERVE = ["serve", MODEL, "--served-model-name", NAME, MODEL, "--max-model-len", "2048"]
PROMPTS = ["Question: What is 2 + 3?\nAnswer:", "The capital of France is", "Once upon a time"]
CHAT = [{"role": "user", "content": "Say hello."}]
MAX_TOKENS = 12
TASK_DIR = Path(__file__).parent / "gsm8k_local"

_REFERENCE_SCRIPT = """
import json, sys
from vllm import LLM, SamplingParams
prompts, chat, max_tokens = json.loads(sys.argv[1])
llm = LLM("kimi-k3-tiny", max_model_len=2048)
params = SamplingParams(temperature=0, max_tokens=max_tokens)
texts = [o.outputs[0].text for o in llm.generate(prompts, params, use_tqdm=False)]
chat_text = llm.chat(chat, params, use_tqdm=False)[0].outputs[0].text
llm.shutdown()
print("REFERENCE " + json.dumps({"texts": texts, "chat": chat_text}))
"""


@pytest.fixture(scope="module")
def reference() -> dict:
    """Greedy outputs of the offline `LLM` (in a clean process: no TRITON_INTERPRET)."""
    payload = json.dumps([PROMPTS, CHAT, MAX_TOKENS])
    run = subprocess.run(
        [sys.executable, "-c", _REFERENCE_SCRIPT, payload],
        cwd=ROOT, env=server_env(), capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    line = next(x for x in run.stdout.splitlines() if x.startswith("REFERENCE "))
    return json.loads(line[len("REFERENCE ") :])


@pytest.fixture(scope="module")
def server():
    with RemoteServer(SERVE) as remote:
        yield remote
    assert remote.exit_code == 0, remote.output()[-3000:]
    assert remote.leftover == []


@pytest.fixture(scope="module")
def client(server: RemoteServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url("/v1"), api_key="unused", max_retries=0)


def test_startup_log_says_what_was_loaded(server: RemoteServer) -> None:
    log = server.output()
    for expected in (
        "Model kimi-k3-tiny",
        "Quantization: none",
        "MLA blocks",
        "KDA state slots",
        "max concurrency",
        "CUDA graphs: off",
        f"http://127.0.0.1:{server.port}",
    ):
        assert expected in log, expected  # fmt: skip


def test_completion_greedy_matches_llm_generate(client: openai.OpenAI, reference: dict) -> None:
    for prompt, expected in zip(PROMPTS, reference["texts"], strict=True):
        reply = client.completions.create(
            model=NAME, prompt=prompt, max_tokens=MAX_TOKENS, temperature=0
        )
        assert reply.choices[0].text == expected
        assert reply.model == NAME
        assert (
            reply.usage.completion_tokens == MAX_TOKENS or reply.choices[0].finish_reason == "stop"
        )
    batch = client.completions.create(
        model=MODEL, prompt=PROMPTS, max_tokens=MAX_TOKENS, temperature=0
    )
    assert [c.index for c in batch.choices] == [0, 1, 2]
    assert [c.text for c in batch.choices] == reference["texts"]


def test_streamed_completion_adds_up(client: openai.OpenAI, reference: dict) -> None:
    stream = client.completions.create(
        model=NAME, prompt=PROMPTS[0], max_tokens=MAX_TOKENS, temperature=0, stream=True,
        stream_options={"include_usage": True},
    )  # fmt: skip
    chunks = list(stream)
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    assert text == reference["texts"][0]
    assert chunks[-1].choices == [] and chunks[-1].usage.prompt_tokens == len(PROMPTS[0])
    finals = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert finals[-1] in ("stop", "length") and set(finals[:-1]) <= {None}


def test_chat_and_streamed_chat_match_llm_chat(client: openai.OpenAI, reference: dict) -> None:
    reply = client.chat.completions.create(
        model=NAME, messages=CHAT, max_tokens=MAX_TOKENS, temperature=0
    )
    assert reply.choices[0].message.content == reference["chat"]
    assert reply.choices[0].message.role == "assistant"
    stream = client.chat.completions.create(
        model=NAME, messages=CHAT, max_tokens=MAX_TOKENS, temperature=0, stream=True
    )
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == reference["chat"]


def test_chat_logprobs(client: openai.OpenAI) -> None:
    reply = client.chat.completions.create(
        model=NAME, messages=CHAT, max_tokens=4, temperature=0, logprobs=True, top_logprobs=3
    )
    content = reply.choices[0].logprobs.content
    assert len(content) == reply.usage.completion_tokens
    for entry in content:
        assert len(entry.top_logprobs) == 3
        # Greedy: the chosen token is the most likely one.
        assert entry.logprob == pytest.approx(entry.top_logprobs[0].logprob, abs=1e-4)


def test_loglikelihood_request_shape(server: RemoteServer) -> None:
    """lm_eval's loglikelihood body: echo + logprobs=1 + max_tokens=1; and max_tokens=0."""
    prompt = "Question: 1+1?\nAnswer: 2"
    body = {"model": NAME, "prompt": prompt, "temperature": 0, "max_tokens": 1, "logprobs": 1,
            "seed": 1234, "echo": True}  # fmt: skip
    choice = requests.post(server.url("/v1/completions"), json=body, timeout=60).json()
    choice = choice["choices"][0]
    logprobs = choice["logprobs"]
    n = len(prompt)  # one byte-level token per ASCII character
    assert len(logprobs["tokens"]) == n + 1 and choice["text"].startswith(prompt)
    assert logprobs["token_logprobs"][0] is None and logprobs["top_logprobs"][0] is None
    assert all(lp <= 0 for lp in logprobs["token_logprobs"][1:])
    assert "".join(logprobs["tokens"][:n]) == prompt
    last = logprobs["top_logprobs"][-1]
    assert logprobs["token_logprobs"][-1] == pytest.approx(max(last.values()), abs=1e-4)
    scored = requests.post(server.url("/v1/completions"), json={**body, "max_tokens": 0}).json()
    only_prompt = scored["choices"][0]["logprobs"]
    assert only_prompt["token_logprobs"] == pytest.approx(logprobs["token_logprobs"][:n], abs=1e-4)
    assert scored["choices"][0]["text"] == prompt


def test_tokenizer_endpoints_lm_eval_probes(server: RemoteServer) -> None:
    info = requests.get(server.url("/tokenizer_info"), timeout=10).json()
    assert info["eos_token"] == "<|eos|>" and info["chat_template"]
    probe = requests.post(
        server.url("/tokenize"), json={"prompt": "test", "add_special_tokens": False}, timeout=10
    ).json()
    tokenizer = get_tokenizer(resolve_model(MODEL)[0])
    assert probe["tokens"] == tokenizer.encode("test", add_special_tokens=False)
    assert probe["count"] == 4
    assert probe["max_model_len"] == 2048
    text = requests.post(server.url("/detokenize"), json={"tokens": probe["tokens"]}).json()
    assert text == {"prompt": "test"}
    models = requests.get(server.url("/v1/models"), timeout=10).json()
    assert [m["id"] for m in models["data"]] == [NAME, MODEL]
    assert models["data"][0]["max_model_len"] == 2048 and models["data"][0]["root"] == MODEL
    assert requests.get(server.url("/version"), timeout=10).json()["version"]


def _run_lm_eval(server: RemoteServer, tmp_path: Path, limit: int | None = None) -> dict:
    """lm_eval with the PR recipe's model_args (max_gen_toks small); returns the results and
    the logged samples."""
    model_args = (
        f"model={NAME},base_url={server.url('/v1/completions')},tokenized_requests=False,"
        "trust_remote_code=True,num_concurrent=8,max_gen_toks=16,timeout=600"
    )
    command = [sys.executable, "-m", "lm_eval", "--model", "local-completions",
               "--model_args", model_args, "--tasks", "gsm8k_local",
               "--include_path", str(TASK_DIR), "--output_path", str(tmp_path),
               "--log_samples"]  # fmt: skip
    if limit is not None:
        command += ["--limit", str(limit)]
    env = server_env()
    env.pop("OPENAI_API_KEY", None)
    run = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, (run.stdout + run.stderr)[-4000:]
    assert "strict-match" in run.stdout and "flexible-extract" in run.stdout
    results = json.loads(next(tmp_path.rglob("results_*.json")).read_text())
    samples = [json.loads(line) for f in tmp_path.rglob("samples_*.jsonl") for line in
               f.read_text().splitlines()]  # fmt: skip
    return {"results": results["results"]["gsm8k_local"], "samples": samples}


def _assert_lm_eval_ran(out: dict, expected_docs: int) -> None:
    results = out["results"]
    for key in ("exact_match,strict-match", "exact_match,flexible-extract"):
        assert 0.0 <= results[key] <= 1.0
    # One logged sample per document and filter.
    assert sorted({s["doc_id"] for s in out["samples"]}) == list(range(expected_docs))
    assert {s["filter"] for s in out["samples"]} == {"strict-match", "flexible-extract"}
    for sample in out["samples"]:
        (response,) = sample["resps"][0]
        assert response != "LMEVAL_MODEL_NONE_ANSWER_PLACEHOLDER"


def test_lm_eval_gsm8k_local(server: RemoteServer, tmp_path: Path) -> None:
    docs = sum(1 for _ in (TASK_DIR / "test.jsonl").open())
    _assert_lm_eval_ran(_run_lm_eval(server, tmp_path), docs)


def test_lm_eval_with_ptpc_quantization(tmp_path: Path) -> None:
    with RemoteServer([*SERVE, "--quantization-config", PTPC]) as remote:
        log = remote.output()
        assert "Online quantization" in log and "self_attn.o_proj" in log, log[-3000:]
        _assert_lm_eval_ran(_run_lm_eval(remote, tmp_path, limit=4), 4)
    assert remote.exit_code == 0 and remote.leftover == []


def test_metrics_back_to_initial_when_idle(server: RemoteServer) -> None:
    deadline = time.monotonic() + 30
    while True:
        metrics = _metrics(server)
        idle = metrics["vllm:num_requests_running"] == metrics["vllm:num_requests_waiting"] == 0
        if idle or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert idle
    assert metrics["vllm:num_free_blocks"] == metrics["vllm:initial_num_free_blocks"] > 0
    assert metrics["vllm:num_free_kda_slots"] == metrics["vllm:initial_num_free_kda_slots"] > 0
    assert metrics["vllm:kv_cache_usage_perc"] == 0
    assert metrics["vllm:generation_tokens_total"] > 0
    assert metrics["vllm:time_to_first_token_seconds_count"] > 0
    assert metrics["vllm:time_per_output_token_seconds_count"] > 0


def _metrics(server: RemoteServer) -> dict[str, float]:
    values: dict[str, float] = {}
    for line in requests.get(server.url("/metrics"), timeout=10).text.splitlines():
        if line and not line.startswith("#") and "{" in line:
            name = line.split("{", 1)[0]
            values[name] = values.get(name, 0.0) + float(line.rsplit(" ", 1)[1])
    return values


def test_no_triton_interpreter_in_the_server_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert "TRITON_INTERPRET" not in server_env()
