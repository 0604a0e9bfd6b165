"""GSM8K-format arithmetic word problems for training and evaluating a small Kimi-Linear model.

Each problem is a short story about one person's items: a starting count, then 2-4 operations
(add or subtract a number of up to three digits, or multiply by a digit from 2 to 9), then a
question. The answer has one reasoning line per operation and GSM8K's final line::

    Question: Mia has 48 stickers. She buys 27 more stickers. Then she gives away 15 stickers.
    How many stickers does Mia have now?
    Answer: 48 + 27 = 75
    75 - 15 = 60
    #### 60

Every count stays in [1, 999], so each line is the arithmetic of numbers of at most three digits,
which a model of a few million parameters with one token per digit can learn in minutes.

The held-out split is fixed by the arithmetic alone: a problem is a test problem iff a hash of its
start and operations falls in the test bucket, so no phrasing of a test problem's arithmetic is
ever trained on, whatever the seeds. `python arith_data.py --out DIR` writes `test.jsonl` and
`train.jsonl` (the 5-shot pool) for the lm_eval task in `arith_gsm8k/`.
"""

import argparse
import hashlib
import json
import random
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

MAX_VALUE = 999
TEST_PERCENT = 10  # share of the arithmetic signatures held out
MIN_STEPS, MAX_STEPS = 2, 4

# (name, subject pronoun, object pronoun)
PEOPLE = [
    ("Mia", "she", "her"), ("Leo", "he", "him"), ("Ava", "she", "her"), ("Noah", "he", "him"),
    ("Zoe", "she", "her"), ("Omar", "he", "him"), ("Lily", "she", "her"), ("Ivan", "he", "him"),
    ("Emma", "she", "her"), ("Ravi", "he", "him"), ("Sara", "she", "her"), ("Ben", "he", "him"),
    ("Nina", "she", "her"), ("Tom", "he", "him"), ("Aiko", "she", "her"), ("Luis", "he", "him"),
]  # fmt: skip
ITEMS = [
    "apples", "marbles", "stickers", "books", "coins", "shells", "pencils", "cards", "stamps",
    "cookies", "beads", "balloons", "flowers", "rocks", "buttons", "toy cars",
]  # fmt: skip

# {name} {p} (subject pronoun) {P} (capitalized) {o} (object pronoun) {item} {n}
START = [
    "{name} has {n} {item}.",
    "{name} starts with {n} {item}.",
    "At first, {name} owns {n} {item}.",
    "{name} collects {n} {item}.",
]
ADD = [
    "{P} buys {n} more {item}.",
    "Then {p} finds {n} more.",
    "A friend gives {o} {n} {item}.",
    "{P} gets another {n} {item}.",
]
SUB = [
    "{P} gives away {n} {item}.",
    "Then {p} loses {n} of them.",
    "{P} sells {n} {item}.",
    "{P} uses {n} {item}.",
]
MUL = [
    "Then {p} ends up with {n} times as many {item}.",
    "After a trade, {p} has {n} times as many {item} as before.",
    "The number of {item} {p} has grows to {n} times as many.",
]
MUL_WORDS = {2: "doubles", 3: "triples"}  # "Then the number of {item} doubles."
QUESTION = [
    "How many {item} does {name} have now?",
    "How many {item} does {p} have in the end?",
    "How many {item} does {name} have at the end?",
]
SYMBOL = {"add": "+", "sub": "-", "mul": "*"}


@dataclass(frozen=True)
class Problem:
    """One word problem: its text, its reasoning answer and its arithmetic."""

    question: str
    answer: str  # reasoning lines, then "#### N"
    result: int
    signature: str  # the arithmetic alone: "start|op n,op n,..."

    def to_json(self) -> dict[str, str]:
        return {"question": self.question, "answer": self.answer}


def _number(rng: random.Random, low: int, high: int) -> int:
    """A number in [low, high] whose digit count is drawn first (1, 2 or 3 digits, as the range
    allows), so short operands are as common as long ones."""
    lengths = [d for d in (1, 2, 3) if low <= 10**d - 1 and 10 ** (d - 1) <= high]
    digits = rng.choice(lengths)
    return rng.randint(max(low, 10 ** (digits - 1)), min(high, 10**digits - 1))


def _operation(rng: random.Random, value: int) -> tuple[str, int]:
    """An operation that keeps the running count in [1, MAX_VALUE]."""
    ops = []
    if value < MAX_VALUE:
        ops.append("add")
    if value > 1:
        ops.append("sub")
    if 2 * value <= MAX_VALUE:
        ops.append("mul")
    op = rng.choice(ops)
    if op == "add":
        return op, _number(rng, 1, MAX_VALUE - value)
    if op == "sub":
        return op, _number(rng, 1, value - 1)
    return op, rng.randint(2, min(9, MAX_VALUE // value))


def _apply(op: str, value: int, n: int) -> int:
    return value + n if op == "add" else value - n if op == "sub" else value * n


def is_test_signature(signature: str) -> bool:
    """Whether the arithmetic `signature` belongs to the held-out split."""
    digest = hashlib.sha256(signature.encode()).digest()
    return int.from_bytes(digest[:8], "big") % 100 < TEST_PERCENT


def make_problem(rng: random.Random) -> Problem:
    """Draw one problem (either split) from `rng`."""
    name, p, o = rng.choice(PEOPLE)
    item = rng.choice(ITEMS)
    words = {"name": name, "p": p, "P": p.capitalize(), "o": o, "item": item}
    start = value = _number(rng, 2, MAX_VALUE)
    sentences = [rng.choice(START).format(n=start, **words)]
    lines, ops = [], []
    for _ in range(rng.randint(MIN_STEPS, MAX_STEPS)):
        op, n = _operation(rng, value)
        if op == "mul" and n in MUL_WORDS and rng.random() < 0.5:
            sentence = f"Then the number of {item} {MUL_WORDS[n]}."
        else:
            sentence = rng.choice({"add": ADD, "sub": SUB, "mul": MUL}[op]).format(n=n, **words)
        sentences.append(sentence)
        result = _apply(op, value, n)
        lines.append(f"{value} {SYMBOL[op]} {n} = {result}")
        ops.append(f"{op} {n}")
        value = result
    sentences.append(rng.choice(QUESTION).format(**words))
    return Problem(
        question=" ".join(sentences),
        answer="\n".join([*lines, f"#### {value}"]),
        result=value,
        signature=f"{start}|{','.join(ops)}",
    )


def iter_problems(seed: int, split: str) -> Iterator[Problem]:
    """Endless problems of `split` ("train" or "test") from a generator seeded with `seed`."""
    if split not in ("train", "test"):
        raise ValueError(f"split must be 'train' or 'test', got {split!r}")
    rng = random.Random(seed)
    want_test = split == "test"
    while True:
        problem = make_problem(rng)
        if is_test_signature(problem.signature) == want_test:
            yield problem


def distinct_problems(seed: int, split: str, count: int) -> list[Problem]:
    """The first `count` problems of `split` from `seed` with distinct arithmetic."""
    seen: set[str] = set()
    out = []
    for problem in iter_problems(seed, split):
        if problem.signature not in seen:
            seen.add(problem.signature)
            out.append(problem)
            if len(out) == count:
                return out
    raise AssertionError("unreachable: iter_problems is endless")


# Seeds of the shipped files; training streams use other seeds (the split is by hash anyway).
TEST_SEED, FEWSHOT_SEED = 1013, 2027


def write_task_files(out: Path, num_test: int, num_train: int) -> None:
    """Write `test.jsonl` (held-out) and `train.jsonl` (the 5-shot pool) into `out`."""
    out.mkdir(parents=True, exist_ok=True)
    for name, seed, split, count in (
        ("test.jsonl", TEST_SEED, "test", num_test),
        ("train.jsonl", FEWSHOT_SEED, "train", num_train),
    ):
        rows = [json.dumps(p.to_json()) for p in distinct_problems(seed, split, count)]
        (out / name).write_text("\n".join(rows) + "\n")
        print(f"wrote {count} {split} problems to {out / name}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--out",
        type=Path,
        default=Path(__file__).parent / "arith_gsm8k",
        help="folder of the lm_eval task (default: arith_gsm8k next to this script)",
    )
    parser.add_argument("--num-test", type=int, default=500, help="held-out problems")
    parser.add_argument("--num-train", type=int, default=200, help="problems of the 5-shot pool")
    parser.add_argument("--show", type=int, default=0, help="print N train problems and exit")
    args = parser.parse_args()
    if args.show:
        for problem in distinct_problems(0, "train", args.show):
            print(f"Question: {problem.question}\nAnswer: {problem.answer}\n")
        return
    write_task_files(args.out, args.num_test, args.num_train)


if __name__ == "__main__":
    main()
