"""`collector_paused`: no automatic collection inside the block, the collector's state restored
after it, and (on a GPU) a capture that garbage holding a CUDA graph cannot break."""

import gc
import weakref

import pytest
import torch

from vllm.utils.gc_utils import collector_paused


class _Cycle:
    """An object in a reference cycle: only a collection frees it."""

    def __init__(self, **held: object) -> None:
        self.me, self.held = self, held


def _unreachable_cycle() -> weakref.ref:
    return weakref.ref(_Cycle())


@pytest.fixture
def eager_collector():
    """The collector on, collecting every generation at each new container (thresholds 1),
    restored after the test."""
    thresholds, enabled = gc.get_threshold(), gc.isenabled()
    gc.enable()
    gc.set_threshold(1, 1, 1)
    yield
    gc.set_threshold(*thresholds)
    (gc.enable if enabled else gc.disable)()


def test_no_automatic_collection_inside_and_the_collector_back_on_after(eager_collector):
    with collector_paused():
        assert not gc.isenabled()
        garbage = _unreachable_cycle()
        _ = [[i] for i in range(1000)]  # would start many collections with the collector on
        assert garbage() is not None
    assert gc.isenabled()
    _ = [[i] for i in range(10)]
    assert garbage() is None


def test_the_collector_is_restored_on_an_error_and_stays_off_if_it_was_off():
    enabled = gc.isenabled()
    try:
        gc.enable()
        with pytest.raises(RuntimeError), collector_paused():
            raise RuntimeError("capture failed")
        assert gc.isenabled()
        gc.disable()
        with collector_paused():
            pass
        assert not gc.isenabled()
    finally:
        (gc.enable if enabled else gc.disable)()


@pytest.mark.gpu
def test_a_capture_survives_garbage_that_holds_a_cuda_graph(eager_collector):
    """A cycle holding a captured graph becomes garbage inside a capture whose Python code would
    start collections: paused, the capture succeeds and replays right, and the next collection
    after it frees the garbage. Unpaused, a collection inside the capture destroys that graph
    and the capture fails (measured on an H100, docs/performance.md "Fifty-fourth run")."""
    x = torch.zeros(1024, device="cuda")
    gc.disable()  # the cycle stays in a young generation, which the collections below walk
    dropped = torch.cuda.CUDAGraph()
    with torch.cuda.graph(dropped):
        y = x + 1
    held = _Cycle(graph=dropped, out=y)
    garbage = weakref.ref(held)
    del dropped, y
    graph = torch.cuda.CUDAGraph()
    gc.enable()
    with collector_paused(), torch.cuda.graph(graph):
        z = x + 2
        del held
        _ = [[i] for i in range(1000)]
        assert garbage() is not None
        z = z * 3
    x.fill_(1.0)
    graph.replay()
    torch.cuda.synchronize()
    assert bool((z == 9.0).all())
    _ = [[i] for i in range(10)]
    assert garbage() is None
