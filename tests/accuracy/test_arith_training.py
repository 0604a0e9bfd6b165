"""The accuracy benchmark's pieces on CPU: the problem generator and its held-out split, the
vectorized CPU KDA functions against transformers' references, and a three-step training run whose
saved folder the fork's loader and `LLM` serve with transformers' greedy output."""

import json
import re
import sys
from pathlib import Path

import pytest
import torch

ACCURACY = Path(__file__).resolve().parents[2] / "benchmarks" / "accuracy"
sys.path.insert(0, str(ACCURACY))

import arith_data  # noqa: E402
import train_arith  # noqa: E402

LINE = re.compile(r"(\d+) ([-+*]) (\d+) = (\d+)")


def test_problems_are_correct_and_bounded():
    problems = arith_data.distinct_problems(3, "train", 300)
    assert problems == arith_data.distinct_problems(3, "train", 300)  # deterministic
    for problem in problems:
        *lines, final = problem.answer.split("\n")
        assert 2 <= len(lines) <= 4 and final == f"#### {problem.result}"
        value = None
        for line in lines:
            a, op, b, c = LINE.fullmatch(line).groups()
            a, b, c = int(a), int(b), int(c)
            assert value is None or a == value  # each line starts from the previous result
            assert c == {"+": a + b, "-": a - b, "*": a * b}[op]
            assert 1 <= c <= 999 and b <= 999 and (op != "*" or 2 <= b <= 9)
            word = arith_data.MUL_WORDS.get(b) if op == "*" else None
            assert str(b) in problem.question or (word and word in problem.question)
            value = c
        assert value == problem.result


def test_held_out_split_is_disjoint_and_shipped_files_regenerate(tmp_path):
    test = arith_data.distinct_problems(arith_data.TEST_SEED, "test", 500)
    train = arith_data.distinct_problems(5, "train", 2000)
    assert all(arith_data.is_test_signature(p.signature) for p in test)
    assert not {p.signature for p in test} & {p.signature for p in train}
    share = sum(map(arith_data.is_test_signature, (p.signature for p in train + test))) / 2500
    assert share == 500 / 2500  # the stream filter, not chance
    arith_data.write_task_files(tmp_path, 500, 200)
    shipped = ACCURACY / "arith_gsm8k"
    for name in ("test.jsonl", "train.jsonl"):
        assert (tmp_path / name).read_text() == (shipped / name).read_text(), name


@pytest.fixture(scope="module")
def modeling():
    return train_arith.import_modeling("cpu")


def test_cpu_functions_match_transformers_references(modeling):
    gen = torch.Generator().manual_seed(0)
    b, t, h, d = 2, 75, 3, 16  # t not a multiple of the chunk

    def leaf(*shape, scale=1.0, shift=0.0):
        return (torch.randn(*shape, generator=gen) * scale + shift).requires_grad_()

    q, k, v = leaf(b, t, h, d), leaf(b, t, h, d), leaf(b, t, h, d)
    g = (-torch.rand(b, t, h, d, generator=gen)).requires_grad_()  # log decays in (-1, 0]
    beta = torch.rand(b, t, h, generator=gen).requires_grad_()
    state = torch.randn(b, h, d, d, generator=gen)
    inputs = (q, k, v, g, beta)
    kwargs = dict(initial_state=state, output_final_state=True, use_qk_l2norm_in_kernel=True)
    ours = train_arith.cpu_chunk_kda(*inputs, **kwargs)
    for reference in (modeling.chunk_kimi_delta_attention, modeling.recurrent_kimi_delta_attention):
        theirs = reference(*inputs, **kwargs)
        for a, r in zip(ours, theirs, strict=True):
            torch.testing.assert_close(a, r, rtol=1e-5, atol=1e-5)
        grads = torch.autograd.grad(sum(x.sum() for x in ours), inputs, retain_graph=True)
        ref_grads = torch.autograd.grad(sum(x.sum() for x in theirs), inputs)
        for a, r in zip(grads, ref_grads, strict=True):
            torch.testing.assert_close(a, r, rtol=1e-4, atol=1e-4)
    x, w = leaf(2, 12, 30), leaf(12, 4)
    torch.testing.assert_close(
        train_arith.cpu_causal_conv1d(x, w, activation="silu"),
        modeling.causal_conv1d_fn(x, w, activation="silu"),
    )


def test_training_run_saves_a_model_the_engine_serves(
    modeling, tmp_path, monkeypatch, torch_reference_kernels
):
    from transformers import PreTrainedTokenizerFast

    from vllm import LLM, SamplingParams
    from vllm.model_executor.model_loader.loader import load_model
    from vllm.transformers_utils.tokenizer import get_tokenizer

    folder = tmp_path / "model"
    args = train_arith.parse_args(
        ["--out", str(folder), "--device", "cpu", "--steps", "3", "--d-model", "32",
         "--kda-heads", "2", "--mla-heads", "2", "--experts", "4", "--seq-len", "512",
         "--rows", "1", "--eval-shots", "0", "--eval-questions", "1", "--eval-every", "2",
         "--final-eval-questions", "1", "--log-every", "1", "--warmup-steps", "1"]
    )  # fmt: skip
    with monkeypatch.context() as patch:  # training swaps in the CPU functions; restore them
        for name in ("chunk_kimi_delta_attention", "causal_conv1d_fn"):
            patch.setattr(modeling, name, getattr(modeling, name))
        summary = train_arith.train(args)
    assert summary["steps"] == 3 and 0.0 <= summary["heldout_greedy_final"] <= 1.0
    log = [json.loads(line) for line in (folder / "train_log.jsonl").read_text().splitlines()]
    assert [r["step"] for r in log[:-1]] == [2, 3] and "heldout_greedy" in log[0]
    assert not (tmp_path / "model.tmp").exists() and not (tmp_path / "model.old").exists()

    assert type(load_model(folder, dtype=torch.float32)).__name__ == "KimiLinearForCausalLM"
    text = "Question: Mia has 5 apples.\nAnswer: 5 + 3 = 8\n#### 8"
    tokenizer = get_tokenizer(folder)
    assert tokenizer.encode(text) == [train_arith.BOS, *train_arith.encode(text)]
    assert tokenizer.decode(tokenizer.encode(text)) == text

    prompts = [
        "Question: " + arith_data.distinct_problems(1, "test", 1)[0].question + "\nAnswer:",
        "Question: Leo has 40 coins.",
        "12 + 7 =",
    ]
    llm = LLM(str(folder), dtype="float32", max_model_len=1024)
    outputs = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=12), use_tqdm=False)
    llm.shutdown()
    hf = modeling.KimiLinearForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    hf_tokenizer = PreTrainedTokenizerFast.from_pretrained(folder)
    for prompt, out in zip(prompts, outputs, strict=True):
        ids = hf_tokenizer(prompt, return_tensors="pt").input_ids
        assert ids[0].tolist() == out.prompt_token_ids
        with torch.no_grad():
            greedy = hf.generate(ids, max_new_tokens=12, do_sample=False)
        assert greedy[0, ids.shape[1] :].tolist() == list(out.outputs[0].token_ids), prompt

    # A continued run starts from the saved weights and keeps the history of the run it continues.
    more = tmp_path / "more"
    continued = train_arith.parse_args(
        ["--out", str(more), "--init", str(folder), "--device", "cpu", "--steps", "2",
         "--seq-len", "512", "--rows", "1", "--eval-shots", "0", "--eval-questions", "1",
         "--eval-every", "5", "--final-eval-questions", "1", "--log-every", "1",
         "--warmup-steps", "1", "--seed", "1"]
    )  # fmt: skip
    with monkeypatch.context() as patch:
        for name in ("chunk_kimi_delta_attention", "causal_conv1d_fn"):
            patch.setattr(modeling, name, getattr(modeling, name))
        assert train_arith.train(continued)["parameters"] == summary["parameters"]
    new_log = [json.loads(line) for line in (more / "train_log.jsonl").read_text().splitlines()]
    assert new_log[: len(log)] == log and new_log[len(log)] == {"continued_from": str(folder)}
    assert [r.get("step") for r in new_log[len(log) + 1 :]] == [2, None]
    assert new_log[-1]["final"] and new_log[-1]["steps"] == 2
