"""Call 108 probe: which warp-specialized forms of the grouped MoE kernels run (each case in a
child process with a time limit, so a hang is cut), their bits against the default launch, and
their time (CUDA events, median of 20 calls, L2 not flushed) at 8192 tokens of top-8 + shared."""

import json
import os
import subprocess
import sys

CASES = {
    "base": ({}, {}),
    "base_p0": ({"VLLM_TRITON_PDL": "0"}, {}),
    "down_ws_dyn": ({}, dict(down_ws=True, down_warps=4)),
    "down_ws_static": ({"WS_STATIC_BOUND": "1"}, dict(down_ws=True, down_warps=4)),
    "down_ws_static_p0": (
        {"WS_STATIC_BOUND": "1", "VLLM_TRITON_PDL": "0"},
        dict(down_ws=True, down_warps=4),
    ),
    "gate_ws_static": (
        {"WS_STATIC_BOUND": "1"},
        dict(gate_up_ws=True, gate_up_warps=4, gate_up_stages=3),
    ),
    "both_ws_static": (
        {"WS_STATIC_BOUND": "1"},
        dict(gate_up_ws=True, gate_up_warps=4, gate_up_stages=3, down_ws=True, down_warps=4),
    ),
}


def child(name: str) -> None:
    import torch

    sys.path.insert(0, "benchmarks/kernels")
    from benchmark_moe import KIMI_LINEAR, make_moe

    from vllm.model_executor.layers.activation import SiluAndMul
    from vllm.model_executor.layers.fused_moe.experts_triton_grouped import (
        moe_experts_triton_grouped,
    )

    dev = torch.device("cuda")
    x, w13, w2, w, ids = make_moe(KIMI_LINEAR, 8192, dev, seed=0, fused_shared=1)
    kw = CASES[name][1]
    out = moe_experts_triton_grouped(x, w13, w2, w, ids, SiluAndMul(), **kw)
    torch.cuda.synchronize()
    path = "/tmp/ws_base.pt"
    same = None
    if name == "base":
        torch.save(out.cpu(), path)
    elif os.path.exists(path):
        same = bool(torch.equal(out.cpu(), torch.load(path)))
    times = []
    for _ in range(23):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        moe_experts_triton_grouped(x, w13, w2, w, ids, SiluAndMul(), **kw)
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) * 1000)
    times = sorted(times[3:])
    print(
        json.dumps(
            {
                "case": name,
                "us": round(times[len(times) // 2], 1),
                "min": round(times[0], 1),
                "same_bits": same,
            }
        ),
        flush=True,
    )


def main() -> None:
    if len(sys.argv) > 1:
        child(sys.argv[1])
        return
    for name, (env, _) in CASES.items():
        try:
            r = subprocess.run(
                [sys.executable, __file__, name],
                env={**os.environ, **env},
                capture_output=True,
                text=True,
                timeout=45,
            )
            lines = [ln for ln in r.stdout.splitlines() if ln.startswith("{")]
            print(
                lines[-1] if lines else f"{name}: rc {r.returncode} {r.stderr[-600:]}", flush=True
            )
        except subprocess.TimeoutExpired:
            print(f"{name}: TIMEOUT (45 s)", flush=True)


if __name__ == "__main__":
    main()
