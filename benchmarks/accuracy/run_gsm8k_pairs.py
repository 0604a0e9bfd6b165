"""Serve one model three ways and compare them on the arithmetic GSM8K task (arith_gsm8k).

Modes: `bf16`; `ptpc_fused`, the upstream PR's PTPC FP8 recipe (per-channel FP8 weights and
per-token dynamic FP8 activations for every attention `o_proj`, everything else bf16) with the
fused KDA epilogue (gated RMSNorm + per-token quantization in one op feeding `o_proj`); and
`ptpc_unfused`, the same recipe with `VLLM_KIMI_K3_FUSED_OPROJ_EPILOGUE=0` (`o_norm`, then `o_proj`
quantizes its own bf16 input).

For each mode:
1. lm_eval `local-completions` against a real `vllm serve` process, with the PR's model_args
   (`tokenized_requests=False`, `num_concurrent`, `max_retries`, remote tokenizer through the
   server's /tokenizer_info), 5-shot, both filters with their standard errors;
2. directly through `LLM`: greedy continuations of the same 5-shot prompts (agreement between modes
   per question), and the full next-token distributions (`prompt_logprobs` over the whole
   vocabulary) of the prompts followed by the reference answers, for the mean per-token KL
   divergence between modes at the answer positions and at every position.

Writes `results.json` and `results.md` (the tables) into `--out`, with the server and lm_eval logs.
On CPU every FP8 op runs its torch reference (FP8 rounding emulated exactly), so the comparison is
the same arithmetic a GPU does, up to GEMM accumulation order.
"""

import argparse
import json
import os
import platform
import random
import re
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

from vllm.entrypoints.openai.api_server import logged_port
from vllm.utils.cli import nonnegative_int, positive_int, replaced_whole, run_main, write_json

ROOT = Path(__file__).resolve().parents[2]
TASK = "arith_gsm8k"
TASK_DIR = Path(__file__).resolve().parent / TASK
SERVED_NAME = "kimi-linear-arith"
# The PR's recipe: only attention o_proj layers are quantized (docs/quantization.md).
PTPC_RECIPE = '{"linear":"fp8_per_channel","ignore":["re:(?!.*self_attn\\\\.o_proj$).*"]}'
FUSION_ENV = "VLLM_KIMI_K3_FUSED_OPROJ_EPILOGUE"
MODES: dict[str, tuple[str | None, str]] = {  # name -> (quantization config, fusion switch)
    "bf16": (None, "1"),
    "ptpc_fused": (PTPC_RECIPE, "1"),
    "ptpc_unfused": (PTPC_RECIPE, "0"),
}
# (reference, compared): KL(reference || compared)
PAIRS = [("bf16", "ptpc_fused"), ("bf16", "ptpc_unfused"), ("ptpc_unfused", "ptpc_fused")]
STRICT = re.compile(r"#### (\-?[0-9\.\,]+)")  # the task's strict-match regex


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)


def child_env(fusion: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}  # torch references
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    env.update(HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", **{FUSION_ENV: fusion})
    return env


class Server:
    """A server process (`command` binds 127.0.0.1 port 0 and logs the address in
    `SERVING_LINE`, as `vllm serve --host 127.0.0.1 --port 0` does) in its own session: `port`
    learnt from its log and healthy on entry, stopped on exit. A port found free and released
    before the server binds it could be taken by another process in between."""

    def __init__(
        self, command: list[str], env: dict[str, str], log_path: Path, timeout: float = 600.0
    ) -> None:
        self.command, self.env, self.log_path, self.timeout = command, env, log_path, timeout
        self.proc: subprocess.Popen | None = None
        self.port: int | None = None

    def __enter__(self) -> "Server":
        self.log_file = self.log_path.open("w")
        self.proc = subprocess.Popen(
            self.command, cwd=ROOT, env=self.env, stdout=self.log_file,
            stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
        deadline = time.monotonic() + self.timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                self.__exit__()
                raise RuntimeError(
                    f"server exited with {self.proc.returncode}; see {self.log_path}"
                )
            if self.port is None:
                self.port = logged_port(self.log_path.read_text(errors="replace"))
                if self.port is None:
                    time.sleep(0.5)
                    continue
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/health", timeout=2):
                    return self
            except OSError:
                time.sleep(1)
        self.__exit__()
        raise TimeoutError(f"server not healthy after {self.timeout:.0f} s; see {self.log_path}")

    def __exit__(self, *exc: object) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        self.log_file.close()


def lm_eval_command(args: argparse.Namespace, port: int, results_dir: Path) -> list[str]:
    """lm_eval `local-completions` against the server on `port`, with the PR's model_args."""
    model_args = (
        f"model={SERVED_NAME},base_url=http://127.0.0.1:{port}/v1/completions,"
        f"tokenized_requests=False,trust_remote_code=True,num_concurrent={args.num_concurrent},"
        f"max_retries=3,max_gen_toks={args.max_gen_toks},max_length={args.max_model_len},"
        "timeout=3600"
    )
    command = [sys.executable, "-m", "lm_eval", "--model", "local-completions",
               "--model_args", model_args, "--tasks", TASK, "--include_path", str(TASK_DIR),
               "--num_fewshot", str(args.num_fewshot), "--output_path", str(results_dir),
               "--log_samples"]  # fmt: skip
    if args.limit is not None:
        command += ["--limit", str(args.limit)]
    return command


def run_lm_eval(args: argparse.Namespace, mode: str, out: Path) -> dict[str, Any]:
    """Serve `mode`, run lm_eval against it; returns its metrics and responses by doc id."""
    quant, fusion = MODES[mode]
    serve = [sys.executable, "-m", "vllm.entrypoints.cli.main", "serve", str(args.model),
             "--served-model-name", SERVED_NAME, "--host", "127.0.0.1", "--port", "0",
             "--dtype", args.dtype, "--max-model-len", str(args.max_model_len),
             "--seed", "0"]  # fmt: skip
    if quant:
        serve += ["--quantization-config", quant]
    results_dir = out / f"lm_eval_{mode}"
    lm_eval: list[str] = []
    env = child_env(fusion)
    start = time.monotonic()
    if args.reuse_lm_eval and any(results_dir.rglob("results_*.json")):
        log(f"{mode}: reusing the lm_eval results in {results_dir}")
    else:
        log(f"{mode}: serving ({' '.join(serve[3:])}, {FUSION_ENV}={fusion})")
        with Server(serve, env, out / f"server_{mode}.log") as server:
            lm_eval = lm_eval_command(args, server.port, results_dir)
            log(f"{mode}: server up after {time.monotonic() - start:.0f} s; lm_eval running")
            with (out / f"lm_eval_{mode}.log").open("w") as lm_log:
                run = subprocess.run(
                    lm_eval, cwd=ROOT, env=env, stdout=lm_log, stderr=subprocess.STDOUT
                )
        if run.returncode != 0:
            raise RuntimeError(
                f"lm_eval failed ({run.returncode}); see {out / f'lm_eval_{mode}.log'}"
            )
    results = json.loads(max(results_dir.rglob("results_*.json")).read_text())
    metrics = results["results"][TASK]
    responses = {}
    for line in next(results_dir.rglob(f"samples_{TASK}_*.jsonl")).read_text().splitlines():
        sample = json.loads(line)
        if sample["filter"] == "strict-match":
            responses[sample["doc_id"]] = sample["resps"][0][0]
    summary = {
        f"{metric}{suffix},{filt}": metrics[f"exact_match{suffix},{filt}"]
        for filt in ("strict-match", "flexible-extract")
        for metric, suffix in (("exact_match", ""), ("exact_match", "_stderr"))
    }
    log(f"{mode}: lm_eval done in {time.monotonic() - start:.0f} s: "
        + ", ".join(f"{k} {v:.4f}" for k, v in summary.items()))  # fmt: skip
    return {"metrics": summary, "responses": responses, "command": lm_eval, "serve": serve}


def read_jsonl(path: Path) -> list[dict[str, str]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def fewshot_prompt(doc: dict[str, str], pool: list[dict[str, str]], shots: int, seed: int) -> str:
    """lm_eval's gsm8k prompt format (target delimiter " ", few-shot delimiter a blank line) with
    `shots` pool examples drawn by `seed`."""
    examples = random.Random(seed).sample(pool, shots)
    parts = [f"Question: {e['question']}\nAnswer: {e['answer']}" for e in examples]
    return "\n\n".join([*parts, f"Question: {doc['question']}\nAnswer:"])


def strict_answer(text: str) -> str | None:
    match = STRICT.search(text)
    return match.group(1) if match else None


def batches(items: list, size: int) -> list[list]:
    return [items[i : i + size] for i in range(0, len(items), size)]


def run_llm(args: argparse.Namespace, mode: str, docs: list, pool: list) -> dict[str, Any]:
    """Greedy continuations of the first `compare_limit` questions and full next-token
    log-distributions over prompt + reference answer of the first `kl_limit`, through `LLM`."""
    import numpy as np

    from vllm import LLM, SamplingParams

    quant, fusion = MODES[mode]
    os.environ[FUSION_ENV] = fusion  # read by each KDA layer at every forward
    start = time.monotonic()
    llm = LLM(str(args.model), dtype=args.dtype, max_model_len=args.max_model_len,
              quantization_config=quant, seed=0, max_logprobs=-1)  # fmt: skip
    prompts = [fewshot_prompt(d, pool, args.num_fewshot, seed=i) for i, d in enumerate(docs)]
    try:
        vocab = json.loads((args.model / "config.json").read_text())["vocab_size"]
        tokenizer = llm.get_tokenizer()
        greedy = SamplingParams(temperature=0, max_tokens=args.max_gen_toks, stop=["Question:"])
        texts = []
        for batch in batches(prompts[: args.compare_limit], args.batch):
            texts += [o.outputs[0].text for o in llm.generate(batch, greedy, use_tqdm=False)]
            log(f"{mode}: greedy {len(texts)}/{args.compare_limit}")
        # k = the whole vocabulary: every position's full distribution
        scored = SamplingParams(temperature=0, max_tokens=1, prompt_logprobs=vocab)
        distributions = []  # per question: (first answer position, [positions, vocab] log-probs)
        for batch in batches(list(range(args.kl_limit)), args.batch):
            full = [f"{prompts[i]} {docs[i]['answer']}" for i in batch]
            for i, out in zip(batch, llm.generate(full, scored, use_tqdm=False), strict=True):
                prefix = tokenizer.encode(prompts[i])
                if out.prompt_token_ids[: len(prefix)] != prefix:
                    raise RuntimeError("the prompt's tokens are not a prefix of prompt + answer")
                dense = np.full((len(out.prompt_logprobs) - 1, vocab), -np.inf, np.float32)
                for row, position in enumerate(out.prompt_logprobs[1:]):  # [0] is None
                    for token, logprob in position.items():
                        dense[row, token] = logprob.logprob
                # row r predicts token r + 1: the answer starts at row len(prefix) - 1
                distributions.append((len(prefix) - 1, dense))
            log(f"{mode}: distributions {len(distributions)}/{args.kl_limit}")
    finally:
        llm.shutdown()
    log(f"{mode}: LLM done in {time.monotonic() - start:.0f} s")
    return {"texts": texts, "distributions": distributions}


def kl_divergence(p_log, q_log) -> "Any":
    """Per-row KL(P || Q) of log-probability rows (0 * log 0 = 0)."""
    import numpy as np

    p = np.exp(p_log)
    with np.errstate(invalid="ignore"):
        terms = np.where(p > 0, p * (p_log - q_log), 0.0)
    return terms.sum(axis=-1)


def compare(llm_runs: dict[str, dict]) -> dict[str, dict[str, Any]]:
    """Greedy agreement and mean KL for each pair of modes."""
    import numpy as np

    pairs = {}
    for ref, other in PAIRS:
        if ref not in llm_runs or other not in llm_runs:
            continue
        a, b = llm_runs[ref], llm_runs[other]
        same_text = [x == y for x, y in zip(a["texts"], b["texts"], strict=True)]
        same_answer = [strict_answer(x) == strict_answer(y)
                       for x, y in zip(a["texts"], b["texts"], strict=True)]  # fmt: skip
        answer_kl, all_kl = [], []
        for (start, p), (_, q) in zip(a["distributions"], b["distributions"], strict=True):
            kl = kl_divergence(p, q)
            all_kl.append(kl)
            answer_kl.append(kl[start:])
        answer_kl, all_kl = np.concatenate(answer_kl), np.concatenate(all_kl)
        pairs[f"{ref} vs {other}"] = {
            "questions": len(same_text),
            "greedy_identical": float(np.mean(same_text)),
            "same_strict_answer": float(np.mean(same_answer)),
            "differing_questions": [i for i, same in enumerate(same_text) if not same],
            "kl_questions": len(a["distributions"]),
            "mean_kl_answer_tokens": float(answer_kl.mean()),
            "mean_kl_all_tokens": float(all_kl.mean()),
            "max_kl_answer_tokens": float(answer_kl.max()),
            "answer_tokens": int(answer_kl.size),
        }
    return pairs


def write_report(out: Path, report: dict[str, Any]) -> str:
    """Write `results.json` and then `results.md` into `out`, each whole or not at all, so that a
    run stopped mid-write keeps the previous complete files; return the tables."""
    write_json(str(out / "results.json"), report, indent=2)
    table = markdown(report)
    with replaced_whole(str(out / "results.md")) as f:
        f.write(table)
    return table


def markdown(report: dict[str, Any]) -> str:
    def f4(x: float) -> str:
        return f"{x:.4f}"

    lines = [
        f"Model `{report['model']}`, task `{TASK}` ({report['num_fewshot']}-shot), "
        f"{report['device']}, torch {report['versions']['torch']}, "
        f"lm_eval {report['versions']['lm_eval']}.",
        "",
        "| mode | strict-match | flexible-extract | LLM greedy exact match |",
        "| --- | --- | --- | --- |",
    ]
    for mode in report["modes"]:
        m = report["lm_eval"].get(mode, {}).get("metrics")
        cells = (
            [f"{f4(m[f'exact_match,{f}'])} ± {f4(m[f'exact_match_stderr,{f}'])}"
             for f in ("strict-match", "flexible-extract")]
            if m else ["-", "-"]
        )  # fmt: skip
        em = report["llm_exact_match"].get(mode)
        lines.append(f"| {mode} | {' | '.join(cells)} | {'-' if em is None else f4(em)} |")
    lines += [
        "",
        "| pair | greedy text identical | same `#### N` | mean KL, answer tokens | "
        "mean KL, all tokens | max KL, answer tokens | lm_eval responses identical |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for name, pair in report["pairs"].items():
        served = report["server_agreement"].get(name)
        lines.append(
            f"| {name} | {f4(pair['greedy_identical'])} ({pair['questions']} q) | "
            f"{f4(pair['same_strict_answer'])} | {pair['mean_kl_answer_tokens']:.3e} | "
            f"{pair['mean_kl_all_tokens']:.3e} | {pair['max_kl_answer_tokens']:.3e} | "
            f"{'-' if served is None else f4(served)} |"
        )
    return "\n".join(lines) + "\n"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    add = parser.add_argument
    add("model", type=Path, help="model folder (e.g. the output of train_arith.py)")
    add("--out", type=Path, required=True, help="folder for results.json, results.md and logs")
    add("--modes", nargs="+", choices=list(MODES), default=list(MODES), help="modes to run")
    add("--limit", type=positive_int, default=None, help="lm_eval documents (None: all 500)")
    add(
        "--compare-limit",
        type=positive_int,
        default=None,
        help="questions of the LLM greedy comparison (default: --limit, or all)",
    )
    add("--kl-limit", type=positive_int, default=100, help="questions for the KL comparison")
    add("--num-fewshot", type=nonnegative_int, default=5, help="few-shot examples per prompt")
    add(
        "--max-gen-toks",
        type=positive_int,
        default=128,
        help="generation limit (answers are < 100)",
    )
    add("--max-model-len", type=positive_int, default=4096, help="context of the served model")
    add("--num-concurrent", type=positive_int, default=8, help="lm_eval's concurrent requests")
    add("--batch", type=positive_int, default=16, help="prompts per LLM.generate call")
    add("--dtype", default="bfloat16", help="model dtype of every mode")
    add("--skip-lm-eval", action="store_true", help="only the direct LLM comparison")
    add(
        "--reuse-lm-eval",
        action="store_true",
        help="take a mode's lm_eval results from --out where an earlier run left them (same "
        "flags), instead of serving and running lm_eval again",
    )
    args = parser.parse_args(argv)
    # Checked before any server or engine starts: each was a traceback once one had.
    if not (args.model / "config.json").is_file():
        parser.error(f"argument model: {str(args.model)!r} is not a model folder (no config.json)")
    if args.out.exists() and not args.out.is_dir():
        parser.error(f"argument --out: {str(args.out)!r} exists and is not a folder")
    args.model = args.model.resolve()
    return args


def main() -> None:
    args = parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    docs = read_jsonl(TASK_DIR / "test.jsonl")
    pool = read_jsonl(TASK_DIR / "train.jsonl")
    args.compare_limit = min(args.compare_limit or args.limit or len(docs), len(docs))
    args.kl_limit = min(args.kl_limit, len(docs))
    lm_eval_runs = {}
    if not args.skip_lm_eval:
        for mode in args.modes:
            lm_eval_runs[mode] = run_lm_eval(args, mode, args.out)
    llm_runs = {mode: run_llm(args, mode, docs, pool) for mode in args.modes}
    server_agreement = {}
    for ref, other in PAIRS:
        if ref in lm_eval_runs and other in lm_eval_runs:
            a, b = lm_eval_runs[ref]["responses"], lm_eval_runs[other]["responses"]
            server_agreement[f"{ref} vs {other}"] = sum(a[d] == b[d] for d in a) / len(a)
    references = [strict_answer(d["answer"]) for d in docs[: args.compare_limit]]
    llm_em = {
        mode: sum(map(lambda t, r: strict_answer(t) == r, run["texts"], references))
        / len(references)
        for mode, run in llm_runs.items()
    }
    import lm_eval
    import torch

    if torch.cuda.is_available():
        device = f"cuda ({torch.cuda.get_device_name()})"
    else:
        device = f"cpu ({platform.machine()}; the FP8 ops run their torch references)"
    report = {
        "model": str(args.model),
        "num_fewshot": args.num_fewshot,
        "modes": args.modes,
        "device": device,
        "versions": {"torch": torch.__version__, "lm_eval": lm_eval.__version__,
                     "python": platform.python_version()},
        "ptpc_recipe": PTPC_RECIPE,
        "lm_eval": {m: {k: v for k, v in r.items() if k != "responses"}
                    for m, r in lm_eval_runs.items()},
        "llm_exact_match": llm_em,
        "pairs": compare(llm_runs),
        "server_agreement": server_agreement,
        "args": {k: str(v) for k, v in vars(args).items()},
    }  # fmt: skip
    print(write_report(args.out, report), flush=True)
    log(f"wrote {args.out / 'results.json'} and {args.out / 'results.md'}")


if __name__ == "__main__":
    sys.exit(run_main(main))
