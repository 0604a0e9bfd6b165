"""Greedy tokens at tensor parallel sizes > 1 against TP = 1 on the same model and prompts.

Dummy weights are drawn TP-invariantly (every rank holds its shard of the same full tensor), so a
TP run and the TP = 1 run compute the same function and differ only in reduction order (the
all-reduce of row-parallel outputs). Each TP size runs in its own process, one after another, so
that each gets the GPUs to itself. For every prompt the script records the greedy tokens and, at
each position, the logprob gap between the two most likely tokens of the TP = 1 run; a divergence
is then either a near-tie (the gap at the first differing position is within a bf16 rounding of
the logits) or a bug. `--max-model-len` defaults to `--input-len` + `--output-len`, `--max-num-seqs`
to `--num-prompts` (all decoded together).

    python benchmarks/benchmark_tp_greedy.py --dry-run
    python benchmarks/benchmark_tp_greedy.py --model kimi-linear-48b-a3b --load-format dummy \\
        --skip-tokenizer-init --tp-sizes 1 2 --num-prompts 64 --input-len 256 --output-len 32 \\
        --output-json tp_greedy.json
"""

import argparse
import contextlib
import dataclasses
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench_utils import (
    DRY_RUN_MODEL,
    apply_dry_run,
    check_args,
    engine_args,
    engine_config,
    environment,
    make_parser,
    random_prompts,
    write_json,
)

from vllm.entrypoints.llm import LLM
from vllm.sampling_params import SamplingParams
from vllm.utils.cli import run_main

# The TP = 1 run asks for the two best logprobs per position, to tell near-ties from bugs.
TOP_LOGPROBS = 2


def workload_sizes(args: Any) -> dict[str, Any]:
    """max_model_len and max_num_seqs: as given, else the workload's (every prompt at once)."""
    return {
        "max_model_len": args.max_model_len or args.input_len + args.output_len,
        "max_num_seqs": args.num_prompts if args.max_num_seqs is None else args.max_num_seqs,
    }


def run_one(args: Any, out: Path) -> None:
    """Generate greedily at `args.tensor_parallel_size` and write tokens, gaps and timing."""
    ea = engine_args(args, **workload_sizes(args))
    kwargs = dataclasses.asdict(ea)
    start = time.perf_counter()
    llm = LLM(kwargs.pop("model"), **kwargs)
    ready_s = time.perf_counter() - start
    vocab = llm.llm_engine.config.model_config.vocab_size
    prompts = random_prompts(args.num_prompts, args.input_len, vocab, args.seed)
    params = SamplingParams(
        temperature=0.0, max_tokens=args.output_len, ignore_eos=True, logprobs=TOP_LOGPROBS
    )
    start = time.perf_counter()
    outputs = llm.generate(prompts, params, use_tqdm=False)
    generate_s = time.perf_counter() - start
    llm.shutdown()
    tokens, gaps = [], []
    for request in outputs:
        completion = request.outputs[0]
        tokens.append(completion.token_ids)
        gaps.append([top_two_gap(position) for position in completion.logprobs])
    record = {"settings": run_settings(args), "tokens": tokens, "gaps": gaps,
              "ready_s": ready_s, "generate_s": generate_s}  # fmt: skip
    write_json(str(out), record)


# Flags that say where runs go, not what they compute.
_NOT_SETTINGS = ("tp_sizes", "runs_dir", "result_file", "output_json", "tensor_parallel_size")


def run_settings(args: Any) -> dict[str, str]:
    """What a run computes from (model, weights, seed, workload, engine flags), as strings: a run
    kept in --runs-dir is reused only by a run of the same settings."""
    return {k: str(v) for k, v in sorted(vars(args).items()) if k not in _NOT_SETTINGS}


def top_two_gap(position: dict) -> float | None:
    """Logprob of the best token minus the second best's at one position (None if one only)."""
    best = sorted((lp.logprob for lp in position.values()), reverse=True)
    return best[0] - best[1] if len(best) > 1 else None


def compare(base: dict[str, Any], other: dict[str, Any]) -> dict[str, Any]:
    """Per-prompt agreement of `other`'s greedy tokens with `base`'s (the TP = 1 run)."""
    identical, first_diffs, gaps_at_diff = 0, [], []
    for ref, got, gaps in zip(base["tokens"], other["tokens"], base["gaps"], strict=True):
        diff = next((i for i, (a, b) in enumerate(zip(ref, got, strict=True)) if a != b), None)
        if diff is None:
            identical += 1
        else:
            first_diffs.append(diff)
            gaps_at_diff.append(gaps[diff])
    count = len(base["tokens"])
    return {
        "prompts": count,
        "identical": identical,
        "identical_fraction": identical / count,
        "first_divergence_positions": first_diffs,
        "top_two_gap_at_divergence": gaps_at_diff,
        "matching_tokens_fraction": statistics.fmean(
            sum(a == b for a, b in zip(r, g, strict=True)) / len(r)
            for r, g in zip(base["tokens"], other["tokens"], strict=True)
        ),
    }


def check_workload(parser: argparse.ArgumentParser, args: Any) -> None:
    """Parser errors, before any run, for sizes that are not positive and for a TP size the
    engine refuses (one that does not split the model, say), rather than a child's traceback
    after the runs before it."""
    for flag in ("num_prompts", "input_len", "output_len"):
        if getattr(args, flag) < 1:
            parser.error(f"argument --{flag.replace('_', '-')}: must be >= 1")
    for tp in sorted(set(args.tp_sizes)):
        if tp < 1:
            parser.error(f"argument --tp-sizes: must be >= 1, got {tp}")
        ea = engine_args(args, tensor_parallel_size=tp, **workload_sizes(args))
        # As every engine benchmark names them (the workload or --max-model-len at fault), but
        # for the TP size, this run's from --tp-sizes.
        needed = args.input_len + args.output_len
        flags = {"--tensor-parallel-size": "--tp-sizes"}
        engine_config(parser, ea, needed, "--input-len + --output-len", flags)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = make_parser(__doc__, sized=("max_num_seqs", "max_model_len"))
    work = parser.add_argument_group("workload")
    work.add_argument("--tp-sizes", type=int, nargs="+", default=[1, 2], help="TP sizes to run")
    work.add_argument("--num-prompts", type=int, default=64, help="prompts, decoded together")
    work.add_argument("--input-len", type=int, default=256, help="prompt tokens")
    work.add_argument("--output-len", type=int, default=32, help="greedy tokens per prompt")
    work.add_argument(
        "--runs-dir",
        help="keep each TP size's tokens in this folder and reuse the sizes already there (so "
        "TP = 1 can run on one GPU beside other work, and TP > 1 later)",
    )
    work.add_argument("--result-file", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    device = check_args(parser, args)
    if args.dry_run:
        apply_dry_run(
            parser, args, quiet=bool(args.result_file), model=DRY_RUN_MODEL, load_format="dummy",
            skip_tokenizer_init=True, tokenizer=None, device="cpu", num_prompts=3, input_len=6,
            output_len=4,
        )  # fmt: skip
    if args.result_file:  # one TP size, in a child process of the run below
        run_one(args, Path(args.result_file))
        return 0
    if args.tensor_parallel_size != 1:
        parser.error(
            "argument -tp/--tensor-parallel-size: this script runs one engine per size of "
            "--tp-sizes; pass the sizes there"
        )
    if min(args.tp_sizes) < 1:
        parser.error(f"argument --tp-sizes: must be >= 1, got {min(args.tp_sizes)}")
    if 1 not in args.tp_sizes:
        parser.error("--tp-sizes must include 1: the other sizes are compared with it")
    if set(args.tp_sizes) == {1} and not args.runs_dir:
        parser.error(
            "argument --tp-sizes: 1 alone compares nothing; keep its tokens with --runs-dir for "
            "a later run of the other sizes"
        )
    check_workload(parser, args)
    settings = run_settings(args)
    runs = {}
    with contextlib.ExitStack() as stack:
        folder = args.runs_dir or stack.enter_context(tempfile.TemporaryDirectory())
        try:
            Path(folder).mkdir(parents=True, exist_ok=True)
        except OSError as e:
            parser.error(f"argument --runs-dir: cannot create {folder!r} ({e.strerror})")
        for tp in sorted(set(args.tp_sizes)):
            result = Path(folder) / f"tp{tp}.json"
            if result.exists():
                kept = json.loads(result.read_text()).get("settings", {})
                differ = sorted(k for k in settings.keys() | kept.keys()
                                if settings.get(k) != kept.get(k))  # fmt: skip
                if differ:
                    shown = ", ".join(f"{k} {kept.get(k)} (now {settings.get(k)})" for k in differ)
                    parser.error(
                        f"argument --runs-dir: {result} was made with other settings: {shown}; "
                        "use another folder, or remove the file to run it again"
                    )
                print(f"TP={tp}: reusing {result}", flush=True)
            else:
                child = [sys.executable, __file__, *argv, "-tp", str(tp), "--result-file",
                         str(result)]  # fmt: skip
                print(f"TP={tp}: generating ...", flush=True)
                code = subprocess.run(child).returncode
                if code:
                    print(f"TP={tp}: the run failed (exit status {code}, its output above)",
                          file=sys.stderr)  # fmt: skip
                    return 1
            runs[tp] = json.loads(result.read_text())
    if len(runs) == 1:
        return 0  # only the TP = 1 tokens, kept in --runs-dir for a later comparison
    record = {
        "environment": environment(device),
        "model": args.model,
        "workload": {k: getattr(args, k) for k in ("num_prompts", "input_len", "output_len")},
        "runs": {
            tp: {"ready_s": r["ready_s"], "generate_s": r["generate_s"]} for tp, r in runs.items()
        },
        "comparisons": {tp: compare(runs[1], r) for tp, r in runs.items() if tp != 1},
    }
    for tp, c in record["comparisons"].items():
        print(
            f"TP={tp} vs TP=1: {c['identical']}/{c['prompts']} prompts identical, "
            f"{100 * c['matching_tokens_fraction']:.1f}% of tokens; first divergences at "
            f"{c['first_divergence_positions']} with top-two logprob gaps "
            f"{[round(g, 4) if g is not None else None for g in c['top_two_gap_at_divergence']]}"
        )
    write_json(args.output_json, record)
    return 0


if __name__ == "__main__":
    sys.exit(run_main(main))
