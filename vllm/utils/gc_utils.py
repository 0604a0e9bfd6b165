"""Keeping Python's cyclic garbage collector off the engine's way: off the heap an engine builds at
start-up, and out of CUDA-graph captures.

An engine's start-up leaves hundreds of thousands of long-lived objects (the model's modules and
parameters, the tokenizer's tables, the captured graphs), and every step allocates short-lived
ones, so collections of the oldest generation keep coming and each walks the whole heap: on the
development CPU a batch-256 decode step of the tiny model took up to 111-118 ms where its median
is 0.8 ms (`benchmarks/benchmark_host_overhead.py`, 3000 steps; docs/performance.md "Tenth run").
`freeze_startup_heap` moves what is alive after start-up out of the collector's generations
(`gc.freeze`): the same run's worst step is then 12-15 ms, most of it the walk of the requests'
token lists, which `Request` now keeps short (vllm/v1/request.py; 8-9 ms, "Eleventh run"). What
the engine later drops in reference cycles is still collected; objects frozen here are not,
until `unfreeze_heap`, which an engine's shutdown calls, or the interpreter's exit (objects
frozen at exit would never be collected, and their native owners report them as leaked).

`collector_paused` keeps automatic collections out of a block of CUDA-graph captures. Destroying
a CUDA graph while a stream is capturing invalidates that capture, and a collection that frees
garbage holding a graph (one whose owner sat in a reference cycle) does just that; measured on
an H100, where the capture then fails with "operation failed due to a previous error during
capture" (docs/performance.md "Fifty-fourth run"). Freed tensors and events do no harm: their
memory goes back to torch's caching allocator. torch's `torch.cuda.graph` no longer collects
before a capture unless `torch.compiler.config.force_cudagraph_gc` is set (pytorch PR #158193;
PR #161037, which would have paused the collector there, was closed), so such garbage can reach
a capture from any earlier code of the process; a Triton `CompiledKernel` freed by a collection
unloads its module, another call a capture does not allow (triton PR #10712). The pause covers
what a collection frees, not what reference counting frees inside the block: owners of graphs
keep them out of reference cycles (`KdaPrefillGraphs`).
"""

import atexit
import contextlib
import gc
from collections.abc import Iterator

atexit.register(gc.unfreeze)


def freeze_startup_heap() -> None:
    """Collect, then freeze everything alive: called once an engine or worker has started. What
    an earlier engine of the process froze is unfrozen first, so that whatever of it has become
    garbage since (an engine dropped without `shutdown`) is collected here."""
    gc.unfreeze()
    gc.collect()
    gc.freeze()


def unfreeze_heap() -> None:
    """Return the frozen objects to the collector (at an engine's shutdown: an offline process
    may build and drop several engines)."""
    gc.unfreeze()


@contextlib.contextmanager
def collector_paused() -> Iterator[None]:
    """Turn automatic collection off for the block (around CUDA-graph captures; module
    docstring), and back on after it if it was on. What became garbage inside is left to the
    next collection, outside the block: for an engine, `freeze_startup_heap`'s at the latest."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()
