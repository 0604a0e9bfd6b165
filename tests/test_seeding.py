"""Every test starts from generators seeded by its own id (tests/conftest.py), not by test order,
and draws its data from local seeded generators, so its data does not depend on test order."""

import ast
import zlib
from pathlib import Path

import torch


def test_global_generator_is_seeded_from_the_test_id(request):
    assert torch.initial_seed() == zlib.crc32(request.node.nodeid.encode())


# torch functions, and in-place tensor methods, that draw random numbers
_TORCH_DRAWS = {
    "rand", "rand_like", "randint", "randint_like", "randn", "randn_like", "randperm", "normal",
    "bernoulli", "multinomial", "poisson",
}  # fmt: skip
_TENSOR_DRAWS = {
    "normal_", "uniform_", "random_", "bernoulli_", "exponential_", "geometric_", "cauchy_",
    "log_normal_",
}  # fmt: skip


def _unseeded_draws(source: str) -> list[str]:
    """Draws from a global generator in `source`: torch draws without `generator=`, and
    `np.random.*` / `random.*` module functions (a seeded `random.Random(...)` is local)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Attribute):
            continue
        name, owner = node.func.attr, ast.unparse(node.func.value)
        draws = (owner == "torch" and name in _TORCH_DRAWS) or name in _TENSOR_DRAWS
        if draws and not any(k.arg == "generator" for k in node.keywords):
            found.append(f"{node.lineno}: {ast.unparse(node.func)}")
        elif owner == "np.random" or (owner == "random" and name != "Random"):
            found.append(f"{node.lineno}: {owner}.{name}")
    return found


def test_test_data_is_drawn_from_local_generators():
    """Tests draw their data from a local, seeded generator, so the data does not depend on what
    drew from the global one before (the per-test seeding above is only the safety net)."""
    tests = Path(__file__).parent
    allowed = {tests / "conftest.py"}  # the per-test seeding itself
    unseeded = {
        str(path.relative_to(tests)): draws
        for path in sorted(tests.rglob("*.py"))
        if path not in allowed and (draws := _unseeded_draws(path.read_text()))
    }
    assert not unseeded, unseeded


def test_the_scan_finds_unseeded_draws():
    source = (
        "torch.randn(3)\nx.normal_(0, 1)\nnp.random.rand(2)\nrandom.random()\n"
        "torch.randn(3, generator=g)\nrandom.Random(0).random()\nrng.randint(0, 3)\n"
    )
    assert [d.split(": ")[1] for d in _unseeded_draws(source)] == [
        "torch.randn", "x.normal_", "np.random.rand", "random.random",
    ]  # fmt: skip
