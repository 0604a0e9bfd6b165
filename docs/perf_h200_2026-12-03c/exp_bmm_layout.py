"""Experiment (call 71, run from the repository root): torch.bmm of MLA's absorbs with the weight
in the previous layout ([h, in, out], contiguous) against the new one ([h, out, in] read through
.transpose(1, 2)), as the layer calls it, at decode rows; 16 rotating copies, graph replay."""

import sys

import torch

sys.path[:0] = ["benchmarks/kernels"]
from kernel_bench import time_graph  # noqa: E402

dev = torch.device("cuda")
for name, (h, n, k) in {"w_uk": (32, 512, 128), "w_uv": (32, 128, 512)}.items():
    new = [torch.randn(h, n, k, device=dev).to(torch.bfloat16) for _ in range(16)]
    old = [w.transpose(1, 2).contiguous() for w in new]  # [h, in, out]
    for m in (1, 2, 8, 64, 256):
        x = torch.randn(m, h, k + 64, device=dev).to(torch.bfloat16)[..., :k].transpose(0, 1)
        out = torch.empty(m, h, n, device=dev, dtype=torch.bfloat16).transpose(0, 1)
        res = {}
        layouts = (("old", old, lambda w: w), ("new", new, lambda w: w.transpose(1, 2)))
        for label, ws, view in layouts:

            def fn(ws=ws, view=view, x=x, out=out):
                for w in ws:
                    torch.bmm(x, view(w), out=out)

            fn()
            res[label] = time_graph(fn, 1, reps=30) / len(ws)
        print(f"{name} M={m:>3}: old layout {res['old']:.2f} us, new {res['new']:.2f} us")
