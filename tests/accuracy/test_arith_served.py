"""Accuracy through the served path: the built-in trained `kimi-linear-arith` served by a real
`vllm serve` process with the PR's PTPC recipe, lm_eval local-completions (the PR's model_args)
5-shot on held-out questions of the local `arith_gsm8k` task, strict-match exact match above a
floor. Random weights score 0 here, so this fails if serving, the PTPC `o_proj` GEMMs or the fused
KDA output epilogue break the model's answers."""

import json
import math
import re
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "entrypoints" / "openai"))

from server_utils import ROOT, RemoteServer, server_env  # noqa: E402

MODEL = "kimi-linear-arith"
TASK = "arith_gsm8k"
TASK_DIR = ROOT / "benchmarks" / "accuracy" / "arith_gsm8k"
PTPC = '{"linear":"fp8_per_channel","ignore":["re:(?!.*self_attn\\\\.o_proj$).*"]}'
# 5-shot prompts are at most ~1.9k single-character tokens (the 5 longest train.jsonl problems
# plus a test question), answers under 80; the longest answer in test.jsonl is 70 characters.
MAX_MODEL_LEN = 2048
MAX_GEN_TOKS = 80
SERVE = ["serve", MODEL, "--max-model-len", str(MAX_MODEL_LEN), "--max-num-seqs", "8",
         "--seed", "0", "--quantization-config", PTPC]  # fmt: skip
LIMIT = 20
# Measured with this test on CPU (2 shared cores, 2026-12-01, the model of the continued training
# run): strict-match 0.95 (19 of the 20), in 67 s including server start-up on a busy machine.
# Greedy decoding and lm_eval's fixed few-shot seed make the run deterministic on one machine; the
# floor leaves 3 binomial standard errors of 20 samples below the measurement for other machines'
# accumulation order: 0.95 - 3 * 0.049 = 0.804, so at least 16 of 20. Random weights score 0.
MEASURED = 0.95
# Rounded down to a whole number of questions.
FLOOR = math.floor(LIMIT * (MEASURED - 3 * math.sqrt(MEASURED * (1 - MEASURED) / LIMIT))) / LIMIT
# The startup log's line for the recipe: every attention o_proj (3 KDA, 1 MLA) and nothing else.
PTPC_LAYERS = re.compile(
    r"4 layers with Fp8PtpcOnlineLinearMethod: \S*layers\.\*\.self_attn\.o_proj \(4\)$", re.M
)


def test_lm_eval_arith_gsm8k_on_ptpc_server(tmp_path: Path) -> None:
    start = time.monotonic()
    with RemoteServer(SERVE, timeout=300) as remote:
        log = remote.output()
        assert PTPC_LAYERS.search(log), log[-3000:]
        model_args = (
            f"model={MODEL},base_url={remote.url('/v1/completions')},tokenized_requests=False,"
            f"trust_remote_code=True,num_concurrent=8,max_retries=3,max_gen_toks={MAX_GEN_TOKS},"
            f"max_length={MAX_MODEL_LEN},timeout=600"
        )
        command = [sys.executable, "-m", "lm_eval", "--model", "local-completions",
                   "--model_args", model_args, "--tasks", TASK, "--include_path", str(TASK_DIR),
                   "--num_fewshot", "5", "--limit", str(LIMIT), "--output_path", str(tmp_path),
                   "--log_samples"]  # fmt: skip
        env = server_env()
        env.pop("OPENAI_API_KEY", None)
        run = subprocess.run(
            command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600
        )
    assert remote.exit_code == 0 and remote.leftover == [], remote.output()[-3000:]
    assert run.returncode == 0, (run.stdout + run.stderr)[-4000:]
    results = json.loads(next(tmp_path.rglob("results_*.json")).read_text())
    samples = [json.loads(line) for f in tmp_path.rglob("samples_*.jsonl")
               for line in f.read_text().splitlines()]  # fmt: skip
    strict = results["results"][TASK]["exact_match,strict-match"]
    # 20 held-out documents, each with its 5-shot prompt and a real generation.
    assert sorted({s["doc_id"] for s in samples}) == list(range(LIMIT))
    for sample in samples:
        assert sample["arguments"]["gen_args_0"]["arg_0"].count("Question:") == 6
        assert sample["resps"][0][0] != "LMEVAL_MODEL_NONE_ANSWER_PLACEHOLDER"
    print(f"strict-match {strict:.3f} on {LIMIT} in {time.monotonic() - start:.0f} s")
    assert strict >= FLOOR, (strict, [s["resps"][0][0] for s in samples][:5])
