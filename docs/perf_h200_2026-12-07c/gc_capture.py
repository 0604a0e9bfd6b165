"""Does Python's cyclic garbage collector, run inside a CUDA-graph capture, invalidate that capture
when the garbage it frees holds CUDA objects made before? Call 218's one failed capture (a
`KdaPrefillGraphs` test after five others in the same process, whose graphs sit in reference
cycles) fits that; this probe asks each kind of garbage in turn, with the default (global)
capture mode, and prints one line per case: captured, or the error. One process per case
(after a failed capture the context may not be clean): `python gc_capture.py KIND`."""

import gc
import sys

import torch


def garbage(kind: str) -> None:
    """Leave one reference cycle holding a CUDA object of `kind`, unreachable."""
    holder: dict = {}
    holder["self"] = holder
    if kind == "tensor":
        holder["x"] = torch.ones(1 << 20, device="cuda")
    elif kind == "graph":
        x = torch.zeros(1 << 10, device="cuda")
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            y = x + 1
        holder["graph"], holder["y"] = g, y
    elif kind == "graph_pool":
        pool = torch.cuda.graph_pool_handle()
        x = torch.zeros(1 << 10, device="cuda")
        graphs = []
        for _ in range(2):
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g, pool=pool):
                y = x * 3
            graphs.append((g, y))
        holder["graphs"] = graphs
    elif kind == "event":
        e = torch.cuda.Event()
        e.record()
        holder["event"] = e


def capture_with_gc(kind: str) -> str:
    gc.collect()
    gc.disable()
    try:
        garbage(kind)
        torch.cuda.synchronize()
        a = torch.ones(1 << 10, device="cuda")
        g = torch.cuda.CUDAGraph()
        try:
            with torch.cuda.graph(g):
                b = a * 2
                freed = gc.collect()
                c = b + 1
        except Exception as e:  # noqa: BLE001 - the probe reports whatever the capture raises
            return f"{kind}: FAILED ({type(e).__name__}: {str(e).splitlines()[0]})"
        g.replay()
        torch.cuda.synchronize()
        replay = "right" if bool((c == 3).all()) else "WRONG"
        return f"{kind}: captured, {freed} objects collected inside, replay {replay}"
    finally:
        gc.enable()


if __name__ == "__main__":
    print(torch.__version__, torch.cuda.get_device_name(), capture_with_gc(sys.argv[1]), flush=True)
