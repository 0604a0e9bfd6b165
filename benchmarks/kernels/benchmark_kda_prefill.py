"""Benchmark the KDA prefill core (`kda_prefill`: fla-core's `chunk_kda` with the gate applied in
its cumsum of the decay) per gate form, as the engine calls it.

Gate forms (--gates):

  softplus   Kimi-Linear's gate, `-exp(A_log) * softplus(g + dt_bias)` (no lower bound)
  bounded    Kimi-K3's, `lower_bound * sigmoid(exp(A_log) * (g + dt_bias))` at lower bound -5,
             through fla-core's `safe_gate` path (`fla_chunk_kda`, the engine's default)
  unsafe     the bounded gate with `safe_gate` off (the engine's call before it took that path)

Shapes: T tokens (--tokens) in N equal sequences (--seqs), H heads (--heads; 32 is Kimi-Linear
at TP 1, 12 Kimi-K3 at TP 8) of 128, bf16, random initial states. Each call is fla-core's
fixed-shape form (`use_graph=True`, as the engine's prefill graphs capture it) captured in a CUDA
graph and replayed (`time_graph`): device time, without the host time of an eager call (about
1.3 ms on an H100: fla-core's Python and ~15 launches). Before timing, each case checks that
`unsafe` and `bounded` agree (relative norm of the difference under 1e-2: the same recurrence,
tensor-core or CUDA-core intra-chunk products); the first call of each form autotunes and
compiles (minutes on a fresh machine).

    python benchmarks/kernels/benchmark_kda_prefill.py --tokens 1024 8192 --csv kda_prefill.csv

`--dry-run` runs `kda_prefill` once per gate form at a tiny shape, untimed: on the GPU through
fla-core, without one through the torch reference (where all three forms are the same
recurrence and must agree bit for bit).
"""

import argparse
import itertools
import sys

import torch
from kernel_bench import note_dry_run_ignores, require_gpu, time_graph, write_csv

from vllm.models.kimi_k3.amd.ops.kda_core import KdaGate, fla_chunk_kda, kda_prefill
from vllm.utils.cli import output_file, positive_int, run_main

HEAD_DIM = 128
LOWER_BOUND = -5.0
GATES = ("softplus", "bounded", "unsafe")


def make_case(tokens: int, seqs: int, heads: int, d: int, device: str, seed: int = 0) -> dict:
    """The core's inputs for `seqs` equal sequences of `tokens` in all (the last one longer by
    the remainder): q, k, v, the gate's raw input, beta, states and offsets."""
    gen = torch.Generator(device=device).manual_seed(seed)
    dtype = torch.bfloat16 if device == "cuda" else torch.float32

    def randn(*shape, scale=1.0):
        return (torch.randn(*shape, generator=gen, device=device) * scale).to(dtype)

    lens = [tokens // seqs] * seqs
    lens[-1] += tokens - sum(lens)
    return dict(
        q=randn(tokens, heads, d), k=randn(tokens, heads, d), v=randn(tokens, heads, d),
        raw=randn(tokens, heads, d, scale=2.0),
        beta=torch.rand(tokens, heads, generator=gen, device=device),
        state=torch.randn(seqs, heads, d, d, generator=gen, device=device) * 0.1,
        qsl=torch.tensor([0, *lens], device=device).cumsum(0),
        a_log=torch.log(torch.rand(heads, generator=gen, device=device) * 15 + 1),
        dt_bias=torch.randn(heads * d, generator=gen, device=device) * 0.1,
    )  # fmt: skip


def gate_of(case: dict, form: str) -> KdaGate:
    return KdaGate(case["a_log"], case["dt_bias"], None if form == "softplus" else LOWER_BOUND)


def graphed_call(case: dict, form: str):
    """fla-core's fixed-shape call for `form` (the engine's prefill-graph call): returns a
    function of no arguments giving (out, final states)."""
    x = [case[name].unsqueeze(0) for name in ("q", "k", "v", "raw", "beta")]
    extra = dict(use_graph=True, max_num_seqs=case["qsl"].numel() - 1)
    if form == "unsafe":
        extra["safe_gate"] = False
    gate = gate_of(case, form)
    return lambda: fla_chunk_kda(*x, case["state"], case["qsl"], gate, **extra)


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b.float()).norm() / b.float().norm())


def dry_run(gates: list[str]) -> int:
    """Each form once through `kda_prefill` (the engine's eager call) at a tiny shape."""
    device = "cuda" if torch.cuda.is_available() else "cpu"
    case = make_case(45, 3, 2, 32, device)
    outs = {}
    for form in gates:
        state = case["state"].clone()
        slots = torch.arange(3, device=device)
        init = torch.ones(3, dtype=torch.bool, device=device)
        if form == "unsafe" and device == "cuda":
            # The engine never calls this form: fla-core directly, as the timed runs do.
            outs[form] = graphed_call(case, form)()[0][0]
            continue
        outs[form] = kda_prefill(case["q"], case["k"], case["v"], case["raw"], case["beta"],
                                 state, case["qsl"], slots, init, gate_of(case, form))  # fmt: skip
    worst = 0.0
    if "bounded" in outs and "unsafe" in outs:
        worst = rel(outs["unsafe"], outs["bounded"])
    ok = all(bool(torch.isfinite(o).all()) for o in outs.values())
    ok = ok and worst <= (1e-2 if device == "cuda" else 0.0)
    verdict = "" if ok else ": FAILED"
    print(f"dry run on {device}: {' '.join(gates)} at T = 45, 3 sequences, 2 heads of 32: "
          f"bounded against unsafe {worst:.2e} (relative norm){verdict}")  # fmt: skip
    return 0 if ok else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--tokens", type=positive_int, nargs="+", default=[1024, 8192],
                        help="prefill tokens of one call")  # fmt: skip
    parser.add_argument("--seqs", type=positive_int, nargs="+", default=[1],
                        help="sequences in the tokens")  # fmt: skip
    parser.add_argument("--heads", type=positive_int, nargs="+", default=[32], help="KDA heads")
    parser.add_argument("--gates", nargs="+", choices=GATES, default=list(GATES),
                        help="gate forms to time")  # fmt: skip
    parser.add_argument("--reps", type=positive_int, default=20, help="graph replays per timing")
    parser.add_argument("--csv", type=output_file, help="write one row per case to this file")
    parser.add_argument("--dry-run", action="store_true",
                        help="each gate form once at a tiny shape, untimed (CPU too)")  # fmt: skip
    args = parser.parse_args(argv)
    gates = list(dict.fromkeys(args.gates))
    if args.dry_run:
        note_dry_run_ignores(parser, args, used=("gates",))
        return dry_run(gates)
    require_gpu(parser, gpu="CUDA GPU with fla-core")
    print(f"{torch.cuda.get_device_name(0)}: {', '.join(gates)}; us a call, graph replay")
    rows = []
    with torch.inference_mode():
        for heads, tokens, seqs in itertools.product(args.heads, args.tokens, args.seqs):
            case = make_case(tokens, seqs, heads, HEAD_DIM, "cuda", seed=tokens + seqs)
            calls = {form: graphed_call(case, form) for form in gates}
            if "bounded" in calls and "unsafe" in calls:
                err = rel(calls["unsafe"]()[0], calls["bounded"]()[0])
                if not err < 1e-2:
                    print(f"H {heads}, T {tokens}, N {seqs}: bounded is off the unsafe form by "
                          f"{err:.2e}")  # fmt: skip
                    return 1
            times = {form: time_graph(fn, 1, reps=args.reps) for form, fn in calls.items()}
            for form, us in times.items():
                rows.append(dict(heads=heads, tokens=tokens, seqs=seqs, gate=form,
                                 us=round(us, 1)))  # fmt: skip
            write_csv(args.csv, rows)
            line = "  ".join(f"{form} {us:8.1f}" for form, us in times.items())
            ratio = ""
            if "bounded" in times and "unsafe" in times:
                ratio = f"  unsafe / bounded {times['unsafe'] / times['bounded']:.2f}x"
            print(f"H {heads:>3}, T {tokens:>6}, N {seqs:>3}: {line}{ratio}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(run_main(main))
