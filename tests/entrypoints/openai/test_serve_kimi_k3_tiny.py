"""End to end: real `vllm serve kimi-k3-tiny` processes on CPU.

The official openai client (completion, streamed completion, chat, streamed chat, logprobs) with
greedy text equal to `LLM.generate` / `LLM.chat`; the prompt forms and sampling fields of
/v1/completions on the real engine; the tokenizer endpoints lm_eval probes; a request's own chat
template on a server that trusts them; lm_eval 0.4.12
local-completions with the PR recipe's model_args on the local GSM8K-format task, plain and on a
server started with the PR recipe's flags, env and PTPC quantization config; /metrics; a clean
SIGTERM shutdown.
"""

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests
from server_utils import ROOT, RemoteServer, server_env

from vllm.model_executor.model_loader.builtin import resolve_model
from vllm.transformers_utils.tokenizer import get_tokenizer

# The client is a test requirement (requirements/test.txt); the offline GPU host lacks it.
openai = pytest.importorskip("openai")

MODEL = "kimi-k3-tiny"
NAME = "moonshotai/Kimi-K3"
PTPC = '{"linear":"fp8_per_channel","ignore":["re:(?!.*self_attn\\\\.o_proj$).*"]}'
# The PR recipe's flags, less the ones refused by name (--kv-cache-dtype fp8,
# --speculative-config: tests/entrypoints/cli) and with sizes that fit kimi-k3-tiny on CPU.
RECIPE = ["serve", MODEL, "--served-model-name", NAME, "--trust-remote-code",
          "--tensor-parallel-size", "1", "--language-model-only", "--reasoning-parser", "kimi_k3",
          "--max-model-len", "2k", "--kv-cache-dtype", "auto",
          "--attention-config", '{"mla_prefill_backend":"FLASH_ATTN"}',
          "--quantization-config", PTPC]  # fmt: skip
RECIPE_ENV = {"VLLM_ROCM_USE_AITER": "1", "VLLM_USE_BREAKABLE_CUDAGRAPH": "0"}
BODY_LIMIT = 1 << 20  # far above any other test's body
ORIGIN = "https://ui.example"
SERVE = ["serve", MODEL, "--served-model-name", NAME, MODEL, "--max-model-len", "2048",
         "--trust-request-chat-template", "--max-request-body-bytes", str(BODY_LIMIT),
         "--allowed-origins", json.dumps([ORIGIN]), "--enable-log-requests",
         "--max-log-len", "3"]  # fmt: skip
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
outputs = llm.generate(prompts, params, use_tqdm=False)
texts = [o.outputs[0].text for o in outputs]
ids = [o.outputs[0].token_ids for o in outputs]
chat_text = llm.chat(chat, params, use_tqdm=False)[0].outputs[0].text
llm.shutdown()
print("REFERENCE " + json.dumps({"texts": texts, "ids": ids, "chat": chat_text}))
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
    assert "Exception ignored" not in run.stderr, run.stderr[-3000:]  # LLM.__del__ at exit
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
        f"Model kimi-k3-tiny (served as {NAME}, {MODEL}): dtype float32, device cpu, TP=1",
        "max_model_len 2048",
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


def test_token_id_prompts_match_text_prompts(client: openai.OpenAI, reference: dict) -> None:
    tokenizer = get_tokenizer(resolve_model(MODEL)[0])
    ids = [tokenizer.encode(prompt) for prompt in PROMPTS]
    one = client.completions.create(model=NAME, prompt=ids[0], max_tokens=MAX_TOKENS, temperature=0)
    assert one.choices[0].text == reference["texts"][0]
    assert one.usage.prompt_tokens == len(ids[0])
    batch = client.completions.create(model=NAME, prompt=ids, max_tokens=MAX_TOKENS, temperature=0)
    assert [c.index for c in batch.choices] == [0, 1, 2]
    assert [c.text for c in batch.choices] == reference["texts"]


def _complete(server: RemoteServer, **body) -> dict:
    body = {"model": NAME, "max_tokens": MAX_TOKENS, **body}
    response = requests.post(server.url("/v1/completions"), json=body, timeout=120)
    assert response.status_code == 200, response.text
    return response.json()


def test_sampling_fields_on_the_real_engine(server: RemoteServer, reference: dict) -> None:
    """Each field changes the reply the way vLLM's does (greedy replies from `reference`)."""
    text, ids = reference["texts"][1], reference["ids"][1]
    # A stop string: cut before it (or after it with include_stop_str_in_output).
    at = next(i for i in range(1, len(text) - 1) if text[i : i + 2].isascii())
    stop = text[at : at + 2]
    cut = text.find(stop)
    choice = _complete(server, prompt=PROMPTS[1], temperature=0, stop=[stop])["choices"][0]
    assert (choice["text"], choice["finish_reason"], choice["stop_reason"]) == (
        text[:cut], "stop", stop)  # fmt: skip
    choice = _complete(server, prompt=PROMPTS[1], temperature=0, stop=stop,
                       include_stop_str_in_output=True)["choices"][0]  # fmt: skip
    assert choice["text"] == text[: cut + len(stop)] and choice["stop_reason"] == stop
    # A stop token id: the reply ends with it (counted, its text left out).
    at = ids.index(ids[3])
    reply = _complete(server, prompt=PROMPTS[1], temperature=0, stop_token_ids=[ids[at]])
    choice = reply["choices"][0]
    assert (choice["finish_reason"], choice["stop_reason"]) == ("stop", ids[at])
    assert reply["usage"]["completion_tokens"] == at + 1 and text.startswith(choice["text"])
    # eos ends a reply with stop_reason null; ignore_eos runs on to max_tokens.
    eos_ids = reference["ids"][2]
    assert len(eos_ids) < MAX_TOKENS, "the third prompt's greedy reply should end with eos"
    choice = _complete(server, prompt=PROMPTS[2], temperature=0)["choices"][0]
    assert (choice["finish_reason"], choice["stop_reason"]) == ("stop", None)
    reply = _complete(server, prompt=PROMPTS[2], temperature=0, ignore_eos=True)
    assert reply["choices"][0]["finish_reason"] == "length"
    assert reply["usage"]["completion_tokens"] == MAX_TOKENS
    # At temperature 1, top_k=1, a tiny top_p and min_p=1 each leave only the greedy token.
    for field in ({"top_k": 1}, {"top_p": 1e-6}, {"min_p": 1.0}):
        reply = _complete(server, prompt=PROMPTS[0], temperature=1.0, **field)
        assert reply["choices"][0]["text"] == reference["texts"][0], field
    # seed: the same seed gives the same sample; n gives n choices.
    sampled = [_complete(server, prompt=PROMPTS[0], temperature=1.0, seed=seed, n=2)
               for seed in (7, 7, 8)]  # fmt: skip
    texts = [[c["text"] for c in reply["choices"]] for reply in sampled]
    assert [len(t) for t in texts] == [2, 2, 2]
    assert texts[0] == texts[1] and texts[0] != texts[2]
    # Plain sampling is not greedy here, so the greedy replies above came from the fields.
    assert reference["texts"][0] not in texts[0] + texts[2]
    assert [c["index"] for c in sampled[0]["choices"]] == [0, 1]


@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions"])
def test_logit_bias_on_no_token_of_the_vocabulary_is_a_400(server: RemoteServer, path: str) -> None:
    """A bias of 0 changes nothing, and is taken; on a token id the vocabulary lacks, or on a key
    that is no token id, the request is malformed, as upstream refuses it (each was a 200)."""
    body = {"prompt": "hi"} if "chat" not in path else {"messages": CHAT}
    body = {**body, "model": NAME, "max_tokens": 1}
    for key in ("320", "-1", "x"):
        response = requests.post(
            server.url(path), json={**body, "logit_bias": {key: 0}}, timeout=60
        )
        assert response.status_code == 400, (key, response.text)
        assert response.json()["error"]["param"] == "logit_bias", response.text
    response = requests.post(server.url(path), json={**body, "logit_bias": {"319": 0}}, timeout=60)
    assert response.status_code == 200, response.text


def test_completion_logprobs_with_the_openai_client(client: openai.OpenAI, reference: dict) -> None:
    reply = client.completions.create(
        model=NAME, prompt=PROMPTS[0], max_tokens=4, temperature=0, logprobs=2
    )
    logprobs = reply.choices[0].logprobs
    assert reply.choices[0].text == reference["texts"][0][: len(reply.choices[0].text)]
    assert len(logprobs.tokens) == len(logprobs.token_logprobs) == 4
    assert "".join(logprobs.tokens) == reply.choices[0].text
    for chosen, top in zip(logprobs.token_logprobs, logprobs.top_logprobs, strict=True):
        assert 1 <= len(top) <= 2  # two alternatives (fewer if their texts coincide)
        assert chosen == pytest.approx(max(top.values()), abs=1e-4)  # greedy: the top one


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
    assert info["model_max_length"] == 2048  # served with --max-model-len 2048, as /tokenize
    probe = requests.post(
        server.url("/tokenize"), json={"prompt": "test", "add_special_tokens": False}, timeout=10
    ).json()
    tokenizer = get_tokenizer(resolve_model(MODEL)[0])
    assert probe["tokens"] == tokenizer.encode("test", add_special_tokens=False)
    assert probe["count"] == 4
    assert probe["max_model_len"] == 2048
    text = requests.post(server.url("/detokenize"), json={"tokens": probe["tokens"]}).json()
    assert text == {"prompt": "test"}


def test_a_trusting_server_renders_a_requests_chat_template(server: RemoteServer) -> None:
    """`--trust-request-chat-template` reaches the chat handler (off, the request is a 400)."""
    own = "{{ messages[0]['content'] }}{{ suffix }}"
    body = {"messages": CHAT, "chat_template": own, "chat_template_kwargs": {"suffix": "!"}}
    counted = requests.post(server.url("/tokenize"), json=body, timeout=10)
    assert counted.status_code == 200, counted.text
    tokenizer = get_tokenizer(resolve_model(MODEL)[0])
    assert counted.json()["tokens"] == tokenizer.encode("Say hello.!", add_special_tokens=False)
    models = requests.get(server.url("/v1/models"), timeout=10).json()
    assert [m["id"] for m in models["data"]] == [NAME, MODEL]
    assert models["data"][0]["max_model_len"] == 2048 and models["data"][0]["root"] == MODEL
    assert requests.get(server.url("/version"), timeout=10).json()["version"]


def test_each_request_is_logged_with_enable_log_requests(server: RemoteServer) -> None:
    prompt = [7, 8, 9, 10, 11]
    reply = _complete(server, prompt=prompt, max_tokens=2, temperature=0, seed=5)
    deadline = time.monotonic() + 10
    while reply["id"] not in server.output() and time.monotonic() < deadline:
        time.sleep(0.1)
    (line,) = [x for x in server.output().splitlines() if f"Received request {reply['id']}" in x]
    assert (
        f"Received request {reply['id']}-0: 5 prompt tokens (first 3) [7, 8, 9], params: " in line
    )
    assert "max_tokens=2" in line and "seed=5" in line, line


def test_server_flags_reach_the_app(server: RemoteServer) -> None:
    body = b'{"prompt": "' + b"x" * BODY_LIMIT + b'"}'
    headers = {"Content-Type": "application/json"}
    response = requests.post(server.url("/v1/completions"), data=body, headers=headers, timeout=60)
    assert response.status_code == 413, response.text
    assert str(BODY_LIMIT) in response.json()["error"]["message"]
    preflight = {"Origin": ORIGIN, "Access-Control-Request-Method": "POST"}
    response = requests.options(server.url("/v1/completions"), headers=preflight, timeout=10)
    assert response.status_code == 200, response.text
    assert response.headers["access-control-allow-origin"] == ORIGIN


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/tokenize"])
def test_a_rendering_over_the_body_limit_is_a_400(server: RemoteServer, path: str) -> None:
    """The model's template writes its eos_token after every message, and `chat_template_kwargs`
    may replace it: 32 kB of it after each of 64 messages is a 2 MB prompt from a 33 kB body.
    Scaled up (500 kB after each of 2,000) a 1 MB request was a gigabyte of prompt, rendered and
    tokenized whole, and the server was killed for memory. A rendering is held to the body
    limit, stopped as it crosses it."""
    body = {"messages": CHAT * 64, "chat_template_kwargs": {"eos_token": "x" * 32_768}}
    response = requests.post(server.url(path), json=body, timeout=60)
    assert response.status_code == 400, response.text[:300]
    error = response.json()["error"]
    assert error["param"] == "messages"
    assert f"more than {BODY_LIMIT} characters" in error["message"], error
    assert "--max-request-body-bytes" in error["message"], error
    # Within the limit the same replacement renders as before (a token a byte: the tiny
    # tokenizer has no merges).
    body["messages"] = CHAT
    response = requests.post(server.url("/tokenize"), json=body, timeout=60)
    assert response.status_code == 200 and response.json()["count"] > 32_768, response.text[:300]


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


def test_lm_eval_on_the_pr_recipe_with_ptpc(tmp_path: Path) -> None:
    """The PR recipe's flags and env, each working (or a no-op that says so); then lm_eval."""
    with RemoteServer(RECIPE, env=RECIPE_ENV) as remote:
        log = remote.output()
        for expected in (
            "Online quantization",
            "4 layers with Fp8PtpcOnlineLinearMethod: "
            "language_model.model.layers.*.self_attn.o_proj (4)",
            "--attention-config mla_prefill_backend='FLASH_ATTN' has no effect",
            "VLLM_USE_BREAKABLE_CUDAGRAPH has no effect",
            "--language-model-only",
            "max_model_len 2000",
        ):
            assert expected in log, (expected, log[-3000:])
        models = requests.get(remote.url("/v1/models"), timeout=10).json()["data"]
        assert [(m["id"], m["max_model_len"]) for m in models] == [(NAME, 2000)]
        chat = {"model": NAME, "messages": CHAT, "max_tokens": 8, "temperature": 0}
        reply = requests.post(remote.url("/v1/chat/completions"), json=chat, timeout=120)
        assert reply.status_code == 200, reply.text  # through the kimi_k3 reasoning parser
        assert reply.json()["choices"][0]["finish_reason"] in ("stop", "length")
        _assert_lm_eval_ran(_run_lm_eval(remote, tmp_path, limit=4), 4)
    assert remote.exit_code == 0 and remote.leftover == []


def test_metrics_back_to_initial_when_idle(server: RemoteServer) -> None:
    # A request of its own: under pytest-xdist this module's other tests may run on other
    # workers, against servers of their own. ignore_eos: at least two tokens, so a TPOT sample.
    body = {"model": NAME, "prompt": PROMPTS[0], "max_tokens": 4, "ignore_eos": True}
    assert requests.post(server.url("/v1/completions"), json=body, timeout=120).status_code == 200
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
    assert metrics["vllm:prompt_tokens_total"] > 0
    assert metrics["vllm:generation_tokens_total"] > 0
    assert metrics["vllm:time_to_first_token_seconds_count"] > 0
    assert metrics["vllm:time_per_output_token_seconds_count"] > 0
    assert metrics["vllm:e2e_request_latency_seconds_count"] > 0
    assert metrics["vllm:request_success_total"] > 0
    for gauge in (
        "vllm:avg_prompt_throughput_toks_per_s",
        "vllm:avg_generation_throughput_toks_per_s",
    ):
        assert metrics[gauge] >= 0


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
