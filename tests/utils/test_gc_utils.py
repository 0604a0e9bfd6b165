"""`collector_paused`: no automatic collection inside the block, the collector's state restored
after it, and (on a GPU) a capture that garbage holding a CUDA graph cannot break."""

import gc
import weakref

import pytest
import torch

from vllm.utils.gc_utils import collector_paused

YOUNG = 10_000  # generation 0's threshold in these tests


class _Cycle:
    """An object in a reference cycle: only a collection frees it."""

    def __init__(self, **held: object) -> None:
        self.me, self.held = self, held


def _unreachable_cycle() -> weakref.ref:
    return weakref.ref(_Cycle())


@pytest.fixture
def young_collector():
    """The collector on and generation 0 empty, so that the next automatic collection comes after
    `YOUNG` more containers and finds what the test made since in generation 0. Restored
    after the test."""
    thresholds, enabled = gc.get_threshold(), gc.isenabled()
    gc.set_threshold(YOUNG, *thresholds[1:])
    gc.enable()
    gc.collect()
    yield
    gc.set_threshold(*thresholds)
    (gc.enable if enabled else gc.disable)()


def _containers(n: int) -> list:
    """`n` new containers, alive until the list goes: enough to start an automatic collection."""
    return [[i] for i in range(n)]


@pytest.fixture
def collections():
    """The generation of every collection that starts while the test runs, in order."""
    started = []

    def record(phase: str, info: dict) -> None:
        if phase == "start":
            started.append(info["generation"])

    gc.callbacks.append(record)
    yield started
    gc.callbacks.remove(record)


def test_no_automatic_collection_inside_and_the_next_one_after(young_collector, collections):
    with collector_paused():
        assert not gc.isenabled()
        garbage = _unreachable_cycle()
        live = _containers(2 * YOUNG)
        assert garbage() is not None and collections == []
    assert gc.isenabled()
    live += _containers(YOUNG)
    assert collections and garbage() is None


def test_the_collector_is_restored_on_an_error_and_left_alone_if_it_was_off():
    enabled = gc.isenabled()
    try:
        gc.enable()
        with pytest.raises(RuntimeError), collector_paused():
            raise RuntimeError("capture failed")
        assert gc.isenabled()
        gc.disable()
        with collector_paused():
            garbage = _unreachable_cycle()
        assert not gc.isenabled() and garbage() is not None
    finally:
        (gc.enable if enabled else gc.disable)()


@pytest.mark.gpu
def test_a_capture_survives_garbage_that_holds_a_cuda_graph(young_collector):
    """A cycle holding a captured graph becomes garbage inside a capture whose Python code would
    start a collection: paused, the capture succeeds and replays right, and a collection after
    it frees the garbage. Unpaused, the collection inside the capture destroys that graph
    and the capture fails (measured on an H100, docs/performance.md "Fifty-fourth run")."""
    x = torch.zeros(1024, device="cuda")
    dropped = torch.cuda.CUDAGraph()
    with torch.cuda.graph(dropped):
        y = x + 1
    held = _Cycle(graph=dropped, out=y)
    garbage = weakref.ref(held)
    del dropped, y
    graph = torch.cuda.CUDAGraph()
    with collector_paused(), torch.cuda.graph(graph):
        z = x + 2
        del held
        live = _containers(2 * YOUNG)
        assert garbage() is not None
        z = z * 3
    x.fill_(1.0)
    graph.replay()
    torch.cuda.synchronize()
    assert bool((z == 9.0).all())
    del live
    gc.collect()
    assert garbage() is None
