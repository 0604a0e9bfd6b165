"""Test-suite setup: Triton's CPU interpreter when there is no GPU, and the `gpu` marker.

Without a GPU the `gpu` tests are skipped; on a GPU host every other test is (they run Triton
under the interpreter on CPU tensors): there `pytest -m gpu` runs the GPU half, and
`CUDA_VISIBLE_DEVICES= pytest` the CPU half.

Without a GPU every Triton kernel runs under ``TRITON_INTERPRET=1``. That interpreter converts fp32
to fp8 wrongly (ties round away from zero and a rounding carry into the exponent is dropped, so
127.97 becomes 64; triton PR #11897) and truncates fp32 to bf16. The fixture below installs
vllm/triton_utils/interpreter_rounding.py, which routes fp32 -> fp8 / bf16 conversions through
torch's correctly rounded cast, so the kernels are checked against the true rounding rather than
a widened tolerance.
"""

import functools
import gc
import importlib.util
import logging
import os
import zlib
from collections.abc import Iterator

import interpreter_fast_paths
import numpy as np
import pytest
import torch
from counted_kernels import COUNTED_KERNELS
from serving_deps import SERVING_DEPS, SERVING_TEST_GLOBS

HAS_GPU = torch.cuda.is_available()
# The serving tests hold no GPU test, and a GPU host may lack the serving dependencies (the lent
# H200 has no fastapi, uvicorn or pydantic): there they are not collected rather than failing to
# import. Without a GPU (CI) a missing dependency still fails them loudly.
_HAS_SERVING_DEPS = all(importlib.util.find_spec(m) for m in SERVING_DEPS)
collect_ignore_glob = [] if _HAS_SERVING_DEPS or not HAS_GPU else list(SERVING_TEST_GLOBS)
if not HAS_GPU:
    # Must precede any import of a module that defines @triton.jit kernels.
    os.environ.setdefault("TRITON_INTERPRET", "1")

from vllm.triton_utils import interpreter_rounding  # noqa: E402 (after the switch above)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "gpu: needs a CUDA or ROCm GPU; skipped without one")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # The two halves need different processes: Triton binds the interpreter at import, so a GPU
    # host compiles every kernel and CPU tensors have no Triton path there (unmarked tests would
    # silently test the references, or fail on their CPU launch counts).
    if HAS_GPU:
        skip = pytest.mark.skip(
            reason="a CPU test (Triton interpreter): run it with the GPU hidden, "
            "CUDA_VISIBLE_DEVICES= pytest"
        )
    else:
        skip = pytest.mark.skip(reason="needs a GPU")
    for item in items:
        if ("gpu" in item.keywords) != HAS_GPU:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def _seed_each_test(request: pytest.FixtureRequest) -> None:
    """Seed the global generators from the test's own id, so a test that draws from them gets
    the same data whatever ran before it (tests should still prefer a local torch.Generator)."""
    seed = zlib.crc32(request.node.nodeid.encode())
    torch.manual_seed(seed)
    np.random.seed(seed)


@pytest.fixture(autouse=True)
def _release_gpu_memory() -> Iterator[None]:
    """On a GPU host, hand what a test left in torch's caching allocator back to the driver.
    `pytest -m gpu -n 4` runs four workers on one GPU, and each would otherwise keep the
    memory of its largest test: on an H100 a launch in another worker then failed with
    "Triton Error [CUDA]: out of memory" (the pointer-load prefill experts, which pass alone;
    docs/performance.md, "Fifty-fifth run"). The collection first frees tensors held only by
    reference cycles."""
    yield
    if HAS_GPU and torch.cuda.is_initialized():
        gc.collect()
        torch.cuda.empty_cache()


@pytest.fixture(autouse=True, scope="session")
def _interpreter_fp8_rounding():
    """Make the Triton interpreter's fp32 -> fp8 / bf16 casts round like torch (and the GPU),
    and install its fast paths (tests/interpreter_fast_paths.py)."""
    if os.environ.get("TRITON_INTERPRET") != "1":
        yield
        return
    restores = [interpreter_rounding.install(), interpreter_fast_paths.install()]
    try:
        yield
    finally:
        for restore in reversed(restores):
            restore()


@pytest.fixture(scope="module")
def torch_reference_kernels() -> Iterator[None]:
    """Run every op's torch reference on CPU instead of its interpreted Triton kernel (engine
    tests: whole models, many steps). Set in the environment, so TP workers spawned by the test
    inherit it (`vllm.triton_utils` reads it at each call). Module-scoped, so that engines built
    by module fixtures (and their workers) run the references too."""
    _import_every_kernel()
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TRITON_INTERPRET", "0")
        yield


@functools.cache
def _import_every_kernel() -> None:
    """Import every vllm module before `torch_reference_kernels` first sets TRITON_INTERPRET=0:
    Triton binds a kernel to the interpreter or the GPU when its module is imported, so a kernel
    module first imported under that fixture (by an engine test) was left bound to the GPU for
    every later test that runs it under the interpreter ("0 active drivers")."""
    import importlib
    import pkgutil

    import vllm

    for module in pkgutil.walk_packages(vllm.__path__, "vllm."):
        importlib.import_module(module.name)


@pytest.fixture(scope="module")
def interpreter_moe_blocks() -> Iterator[None]:
    """Model and MoE-block tests: the GEMV MoE path (`moe_experts_triton`) with wider tiles than
    its defaults, two programs per routed row (I 32) and per token (H 48 / 64). The interpreter
    pays per program, and the default tiles (one hidden output per down program) made the
    experts most of a model test's time. Only block_k / block_i cut a sum into chunks, so the
    outputs are the defaults' bit for bit; the kernel's tests run the defaults, with tail blocks.
    Module-scoped, like `torch_reference_kernels`; a GPU keeps the defaults."""
    if os.environ.get("TRITON_INTERPRET") != "1":
        yield
        return
    from vllm.model_executor.layers.fused_moe import experts

    triton_path = experts.moe_experts_triton

    @functools.wraps(triton_path)
    def wide(*args, **kwargs):
        return triton_path(*args, **{"block_n": 16, "block_h": 32, **kwargs})

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(experts, "moe_experts_triton", wide)
        yield


class _CountedKernel:
    """A Triton kernel whose `kernel[grid](...)` launches are counted under its name."""

    def __init__(self, kernel, name: str, counts: dict[str, int]) -> None:
        self._kernel, self._name, self._counts = kernel, name, counts

    def __getitem__(self, grid):
        self._counts[self._name] += 1
        return self._kernel[grid]

    def __getattr__(self, attr):
        return getattr(self._kernel, attr)


@pytest.fixture
def startup_bars(monkeypatch) -> None:
    """The model runner's start-up progress bars on rank 0 even where the shell that started the
    tests set `TQDM_DISABLE` (tqdm reads it when imported), for tests that look for them."""
    import vllm.v1.worker.model_runner as runner_module

    monkeypatch.setattr(runner_module, "tqdm", functools.partial(runner_module.tqdm, disable=False))


@pytest.fixture
def vllm_records() -> Iterator[list[logging.LogRecord]]:
    """The records the `vllm` logger handles from INFO up during the test: that logger does not
    propagate (vllm/logger.py), so pytest's caplog sees none of them."""
    records: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = records.append
    logger = logging.getLogger("vllm")
    level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        yield records
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)


@pytest.fixture
def triton_launches(monkeypatch):
    """Counts launches of the fork's Triton kernels, by kernel name, during the test.

    Without it a test comparing a kernel with its torch reference could silently compare the
    reference with itself (a dispatch that always falls back passes every numeric check).
    """
    import importlib

    counts: dict[str, int] = {}
    for module_name, kernels in COUNTED_KERNELS.items():
        module = importlib.import_module(module_name)
        for name in kernels:
            counts[name] = 0
            monkeypatch.setattr(module, name, _CountedKernel(getattr(module, name), name, counts))
    return counts


@pytest.fixture
def launch_constexprs(monkeypatch):
    """``record(module, name)``: a list that receives the constexpr ``name`` of each launch the
    module makes through its `launch` (vllm/triton_utils/launch.py) during the test, in order,
    for the launches whose spec holds it; the launches still run."""

    def record(module, name: str) -> list:
        seen = []
        launch = module.launch

        def spy(kernel, grid, args, spec):
            if name in spec.kwargs:
                seen.append(spec.kwargs[name])
            return launch(kernel, grid, args, spec)

        monkeypatch.setattr(module, "launch", spy)
        return seen

    return record
