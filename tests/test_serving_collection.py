"""On a GPU host without the serving dependencies (the lent H200 and H100 have no fastapi, uvicorn
or pydantic) tests/conftest.py leaves the serving tests uncollected by glob, so that `pytest -m
gpu tests` runs instead of stopping at an ImportError. A glob list goes stale when a test starts
importing the server: this reads the module-level imports of vllm/ and tests/ (statically, no
import runs) and checks that the globs cover every test module whose imports reach those packages,
and that no covered module holds a GPU test the host would then never run."""

import ast
import fnmatch
from collections.abc import Iterator
from functools import cache
from pathlib import Path

from serving_deps import SERVING_DEPS, SERVING_TEST_GLOBS

TESTS = Path(__file__).resolve().parent
ROOT = TESTS.parent


def _module_level(nodes: list[ast.stmt]) -> Iterator[ast.stmt]:
    """Statements that run at import: not function bodies, not `if TYPE_CHECKING:` blocks."""
    for node in nodes:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            yield from _module_level(node.orelse)
            continue
        yield node
        for field in ("body", "orelse", "finalbody", "handlers"):
            yield from _module_level(getattr(node, field, []))


def _imported_names(path: Path) -> set[str]:
    names = set()
    for node in _module_level(ast.parse(path.read_text(), str(path)).body):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            assert not node.level, f"{path}: relative import (none exist; the scan assumes so)"
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


@cache
def _helpers() -> dict[str, Path]:
    """Test helper modules (not tests, not conftest) by module name: each name is unique."""
    paths = [p for p in TESTS.rglob("*.py") if not p.name.startswith(("test_", "conftest"))]
    helpers = {p.stem: p for p in paths}
    assert len(helpers) == len(paths), "two test helper modules share a name"
    return helpers


def _resolve(name: str, importer: Path) -> Path | None:
    """The source file of a vllm module or of a test helper module, else None."""
    parts = name.split(".")
    if parts[0] == "vllm":
        base = ROOT.joinpath(*parts)
        for path in (base.with_suffix(".py"), base / "__init__.py"):
            if path.is_file():
                return path
        return None
    for directory in (importer.parent, TESTS):  # pytest puts both on sys.path
        path = directory.joinpath(*parts).with_suffix(".py")
        if path.is_file():
            return path
    # A helper of another folder, which the importer puts on sys.path itself (as
    # accuracy/test_arith_served.py does with entrypoints/openai/server_utils.py).
    return _helpers().get(name)


def _edges(path: Path) -> tuple[bool, set[Path]]:
    """Whether `path` imports a serving dependency itself, and the sources it imports."""
    direct, sources = False, set()
    for name in _imported_names(path):
        parts = name.split(".")
        direct |= parts[0] in SERVING_DEPS
        # Importing a.b.c runs a/__init__, a/b/__init__, then a/b/c.
        for i in range(1, len(parts) + 1):
            source = _resolve(".".join(parts[:i]), path)
            if source is not None and source != path:
                sources.add(source)
    return direct, sources


@cache
def _reaching() -> frozenset[Path]:
    """Every source under vllm/ and tests/ whose module-level imports reach SERVING_DEPS."""
    graph = {p: _edges(p) for d in (ROOT / "vllm", TESTS) for p in d.rglob("*.py")}
    reaching = {p for p, (direct, _) in graph.items() if direct}
    grew = True
    while grew:  # to a fixpoint: import cycles are fine
        new = {p for p, (_, sources) in graph.items() if p not in reaching and sources & reaching}
        reaching |= new
        grew = bool(new)
    return frozenset(reaching)


def _reaches_serving_deps(path: Path) -> bool:
    return path.resolve() in _reaching()


def _ignored(path: Path) -> bool:
    return any(fnmatch.fnmatch(str(path), str(TESTS / glob)) for glob in SERVING_TEST_GLOBS)


def test_the_scan_sees_the_server_import_chain() -> None:
    assert _reaches_serving_deps(ROOT / "vllm/entrypoints/openai/api_server.py")
    assert _reaches_serving_deps(TESTS / "entrypoints/openai/test_server_utils.py")
    assert not _reaches_serving_deps(ROOT / "vllm/engine/arg_utils.py")
    # Imports `server_utils` (uvicorn) from entrypoints/openai/, which it puts on sys.path.
    assert _reaches_serving_deps(TESTS / "accuracy/test_arith_served.py")


def test_every_test_module_that_imports_the_server_is_left_out_on_gpu_hosts_without_it() -> None:
    reaching = {p for p in TESTS.rglob("test_*.py") if _reaches_serving_deps(p)}
    uncovered = sorted(str(p.relative_to(TESTS)) for p in reaching if not _ignored(p))
    assert not uncovered, (
        f"{uncovered} import {SERVING_DEPS} at module level: add them to SERVING_TEST_GLOBS in "
        "tests/serving_deps.py, or import the server inside the tests that need it"
    )
    assert reaching, "the scan found no serving test at all"


def test_no_test_module_left_out_holds_a_gpu_test() -> None:
    ignored = [p for p in TESTS.rglob("test_*.py") if _ignored(p)]
    assert ignored
    gpu = sorted(str(p.relative_to(TESTS)) for p in ignored if "mark.gpu" in p.read_text())
    assert not gpu, f"{gpu} hold GPU tests that a GPU host without {SERVING_DEPS} never collects"
