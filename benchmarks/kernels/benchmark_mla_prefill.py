"""Benchmark the MLA prefill's glue around the fused attention at Kimi-Linear's sizes (32 heads,
nope 128, rope 64, v 128, bf16), the current path against the one it replaced, in one run.

Providers, per context length (one new prompt: Lq = ctx):

  key:cat        torch's cat of k_nope with k_pe broadcast over the heads (the old key)
  key:kernel     `mla_prefill_key`, one Triton launch (the new key)
  copy_same_size `copy_` of a tensor the key's size: the yardstick for the two above
  operands:torch q and v made contiguous by torch's copies, and `mla_prefill_key` (cuDNN's
                 per-length-class path before `mla_prefill_dense_operands`)
  operands:kernel `mla_prefill_dense_operands`: q, k and v in one Triton launch
  layer:old      the old prefill up to o_proj's input: cat, v zero-padded to 192, SDPA, the
                 output copied into the layer's [T, H, v] buffer, per-token FP8 quantization
  layer:new      the new one: `mla_prefill_attention` (up to 2048 tokens the key's launch and
                 the value read in place from kv_b_proj's output, above q, k and v in one
                 launch) and per-token FP8 quantization of the attention output in place

k_nope and v are the halves of one `kv_b_proj` output `[ctx, H, 256]`, k_pe the last 64 columns of
`[ctx, 576]` cache rows, as the layer passes them; the operands providers take q as the layer does
too, a column slice of the fused `[q | kv_a]` projection. Before timing, the new key, operands and
layer output are checked bit for bit against the old (the old layer through the fused kernel the new
one takes). Timing: L2 flushed before each call, the call replayed from a CUDA graph (`--timing
graph`) or launched eagerly (`--timing eager`, should a capture of the fused attention fail). Bytes
for the key providers: k_nope read, k written (k_pe is 1/64 of it); for the operands providers those
plus q and v each read and written; % of copy against an eager `copy_` of --copy-gib GiB measured in
the same run.

    python benchmarks/kernels/benchmark_mla_prefill.py --csv mla_prefill.csv
    python benchmarks/kernels/benchmark_mla_prefill.py --ctx 8192 --timing eager

`--dry-run` checks the new against the old at a tiny shape, untimed; without a GPU run it under
the Triton interpreter: TRITON_INTERPRET=1 python ... --dry-run
"""

import argparse
import statistics
import sys
from collections.abc import Callable

import torch
import torch.nn.functional as F
from kernel_bench import (
    add_common_args,
    note_dry_run_ignores,
    print_copy_gbps,
    require_gpu,
    round_like_the_gpu_if_interpreting,
    time_flushed,
    write_csv,
)
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.nn.attention.bias import causal_lower_right

from vllm.model_executor.layers.quantization.utils.fp8_per_token import per_token_fp8_quant
from vllm.models.kimi_k3.amd.ops.mla_prefill import (
    _gpu_path,
    mla_prefill_attention,
    mla_prefill_dense_operands,
    mla_prefill_key,
)
from vllm.triton_utils import use_triton
from vllm.utils.cli import positive_int, run_main

HEADS, NOPE, ROPE, V, LATENT = 32, 128, 64, 128, 512
SDPA_BACKEND = {
    "flash": SDPBackend.FLASH_ATTENTION,
    "cudnn_classes": SDPBackend.CUDNN_ATTENTION,
    "cudnn_shapes": SDPBackend.CUDNN_ATTENTION,
}


def make_case(ctx: int, heads: int, nope: int, rope: int, v_dim: int, device: str, seed: int = 0):
    """(q, k_nope, k_pe, v) as MLA passes them: k_nope and v halves of one kv_b_proj output,
    k_pe a column slice of gathered cache rows."""
    gen = torch.Generator(device=device).manual_seed(seed)

    def draw(*shape):
        return torch.randn(*shape, generator=gen, device=device).to(torch.bfloat16)

    q = draw(ctx, heads, nope + rope)
    kv = draw(ctx, heads * (nope + v_dim)).view(ctx, heads, nope + v_dim)
    cached = draw(ctx, LATENT + rope)
    return q, kv[..., :nope], cached[:, LATENT:], kv[..., nope:]


def sliced_q(q: torch.Tensor) -> torch.Tensor:
    """`q` copied into the leading columns of a `[q | kv_a]` projection's rows, as MLA slices it."""
    ctx, heads, qk = q.shape
    fused = torch.empty(ctx, heads * qk + LATENT + ROPE, dtype=q.dtype, device=q.device)
    fused[:, : heads * qk] = q.view(ctx, -1)
    return fused[:, : heads * qk].view(ctx, heads, qk)


def torch_operands(q, k_nope, k_pe, v):
    """The per-length-class path's operands before `mla_prefill_dense_operands`."""
    return q.contiguous(), mla_prefill_key(k_nope, k_pe), v.contiguous()


def same_operands(q, k_nope, k_pe, v) -> bool:
    got = mla_prefill_dense_operands(q, k_nope, k_pe, v)
    return all(
        torch.equal(a, b) for a, b in zip(got, torch_operands(q, k_nope, k_pe, v), strict=True)
    )


def old_key(k_nope: torch.Tensor, k_pe: torch.Tensor) -> torch.Tensor:
    ctx, heads, _ = k_nope.shape
    return torch.cat([k_nope, k_pe.unsqueeze(1).expand(ctx, heads, k_pe.shape[1])], dim=-1)


def old_attention(q, k_nope, k_pe, v, scale: float) -> torch.Tensor:
    """The replaced path: cat, v zero-padded to q's head dim (on a GPU), the output's first Dv
    columns."""
    lq, _, qk = q.shape
    ctx, dv = v.shape[0], v.shape[2]
    k = old_key(k_nope, k_pe)
    if q.is_cuda:
        mask = causal_lower_right(lq, ctx)
        v = F.pad(v, (0, qk - dv))
    else:
        mask = torch.ones(lq, ctx, dtype=torch.bool, device=q.device).tril(ctx - lq)
    out = F.scaled_dot_product_attention(
        q.transpose(0, 1).unsqueeze(0), k.transpose(0, 1).unsqueeze(0),
        v.transpose(0, 1).unsqueeze(0), attn_mask=mask, scale=scale,
    )  # fmt: skip
    return out[0, :, :, :dv].transpose(0, 1)


def old_layer(q, k_nope, k_pe, v, scale: float, out: torch.Tensor):
    out.copy_(old_attention(q, k_nope, k_pe, v, scale))
    return per_token_fp8_quant(out.view(out.shape[0], -1))


def new_layer(q, k_nope, k_pe, v, scale: float):
    return per_token_fp8_quant(mla_prefill_attention(q, k_nope, k_pe, v, scale))


def same_codes(a, b) -> bool:
    return torch.equal(a[0].view(torch.uint8), b[0].view(torch.uint8)) and torch.equal(a[1], b[1])


def dry_run() -> int:
    device = "cuda" if torch.cuda.is_available() else "cpu"
    q, k_nope, k_pe, v = make_case(24, 3, 16, 8, 16, device)
    scale = 24**-0.5
    key_ok = torch.equal(mla_prefill_key(k_nope, k_pe), old_key(k_nope, k_pe))
    key_ok = key_ok and same_operands(sliced_q(q), k_nope, k_pe, v)
    out = torch.empty(v.shape, dtype=v.dtype, device=device)
    layer_ok = same_codes(
        new_layer(q, k_nope, k_pe, v, scale), old_layer(q, k_nope, k_pe, v, scale, out)
    )
    path = "Triton" if use_triton(torch.device(device)) else "the torch references"
    print(
        f"dry run on {device} via {path} at ctx 24, 3 heads: key and operands bit for bit: "
        f"{key_ok}, layer codes bit for bit: {layer_ok}"
    )
    return 0 if key_ok and layer_ok else 1


def time_flushed_eager(fn: Callable[[], object], reps: int) -> float:
    """Median microseconds per eager call with L2 flushed before each (the flush keeps the GPU
    busy while the host launches the call)."""
    flush = torch.empty(256 * 1024 * 1024, dtype=torch.int8, device="cuda")
    fn()
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    for start, end in zip(starts, ends, strict=True):
        flush.zero_()
        start.record()
        fn()
        end.record()
    torch.cuda.synchronize()
    return statistics.median(s.elapsed_time(e) * 1e3 for s, e in zip(starts, ends, strict=True))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--ctx", type=positive_int, nargs="+", default=[2048, 8192], help="prompt lengths"
    )
    parser.add_argument(
        "--timing", choices=["graph", "eager"], default="graph",
        help="replay each call from a CUDA graph, or launch it eagerly (default: graph)",
    )  # fmt: skip
    parser.add_argument("--reps", type=positive_int, default=30, help="flushed calls per timing")
    add_common_args(
        parser, csv="write one row per (ctx, provider) to this CSV file",
        dry_run="checked at a tiny shape (CPU too)",
    )  # fmt: skip
    args = parser.parse_args(argv)
    if args.dry_run:
        note_dry_run_ignores(parser, args)
        round_like_the_gpu_if_interpreting()
        return dry_run()
    require_gpu(parser)
    copy = print_copy_gbps(args.copy_gib)
    scale = (NOPE + ROPE) ** -0.5
    rows = []
    with torch.inference_mode():
        for ctx in args.ctx:
            q, k_nope, k_pe, v = make_case(ctx, HEADS, NOPE, ROPE, V, "cuda", seed=ctx)
            out = torch.empty(v.shape, dtype=v.dtype, device="cuda")
            key_ok = torch.equal(mla_prefill_key(k_nope, k_pe), old_key(k_nope, k_pe))
            q_sliced = sliced_q(q)
            key_ok = key_ok and same_operands(q_sliced, k_nope, k_pe, v)
            # The glue compared through the fused kernel the new path takes (flash up to
            # FLASH_MAX_PROMPT, cuDNN above), whichever torch would choose for the old one.
            with sdpa_kernel(SDPA_BACKEND[_gpu_path(ctx, ctx)]):
                old = old_layer(q, k_nope, k_pe, v, scale, out)
            layer_ok = same_codes(new_layer(q, k_nope, k_pe, v, scale), old)
            print(
                f"ctx {ctx}: key and operands bit for bit {key_ok}, layer codes bit for bit "
                f"{layer_ok}"
            )
            if not (key_ok and layer_ok):
                return 1
            src = torch.empty(ctx, HEADS, NOPE + ROPE, dtype=torch.bfloat16, device="cuda")
            dst = torch.empty_like(src)
            providers = {
                "key:cat": lambda k_nope=k_nope, k_pe=k_pe: old_key(k_nope, k_pe),
                "key:kernel": lambda k_nope=k_nope, k_pe=k_pe: mla_prefill_key(k_nope, k_pe),
                "copy_same_size": lambda src=src, dst=dst: dst.copy_(src),
                "operands:torch": lambda c=(q_sliced, k_nope, k_pe, v): torch_operands(*c),
                "operands:kernel": lambda c=(q_sliced, k_nope, k_pe, v): mla_prefill_dense_operands(
                    *c
                ),
                "layer:old": lambda c=(q, k_nope, k_pe, v), out=out: old_layer(*c, scale, out),
                "layer:new": lambda c=(q, k_nope, k_pe, v): new_layer(*c, scale),
            }
            key_bytes = 2 * ctx * HEADS * (NOPE + (NOPE + ROPE))  # k_nope read, k written
            # ... and q and v each read and written
            operand_bytes = key_bytes + 2 * 2 * ctx * HEADS * (NOPE + ROPE + V)
            for label, fn in providers.items():
                if args.timing == "graph":
                    us = time_flushed(fn, reps=args.reps)
                else:
                    us = time_flushed_eager(fn, args.reps)
                row = dict(ctx=ctx, provider=label, us=round(us, 2))
                line = f"  {label:>14}: {us:9.1f} us"
                if label.startswith(("key", "copy", "operands")):
                    moved = {"copy_same_size": 2 * src.numel() * 2, "operands": operand_bytes}.get(
                        label.split(":")[0], key_bytes
                    )
                    gbps = moved / us / 1e3
                    row.update(gbps=round(gbps), pct_copy=round(100 * gbps / copy, 1))
                    line += f" {gbps:6.0f} GB/s {100 * gbps / copy:5.1f}% of copy"
                rows.append(row)
                write_csv(args.csv, rows)  # after every row: an interrupted run keeps its rows
                print(line, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(run_main(main))
