"""Routed experts for decode-size batches: two GEMV-style Triton kernels that stream each chosen
expert's weights once per (routed row, output block).

`moe_experts_triton(x, w13, w2, topk_weights, topk_ids, act_and_mul)` computes what the
implementations in `experts.py` compute (`moe_experts_loop` / `moe_experts_gathered` are its torch
references), with the same shapes:

  x             `[T, H]` bf16 / fp16 / fp32, unit stride on the last dim
  w13           `[E, 2 * I, H]` (gate | up of each expert), x's dtype, unit stride on the last dim
  w2            `[E, H, I]`, x's dtype, unit stride on the last dim
  topk_weights  `[T, K]` floating point (read as fp32)
  topk_ids      `[T, K]` int32 / int64, values in `[0, E)` (not checked: that would read them on
                the host)
  act_and_mul   `SiluAndMul` or `SituAndMul`, the activations the first kernel fuses
                (fused_activation.py)
  returns       `[T, H]` in x's dtype

Kernels (R = T * K routed rows, row r = (t, k) = (r // K, r % K), e = topk_ids[t, k]):

  gate/up  grid (R, cdiv(I, block_n)). Dot products of x[t] with block_n gate rows and block_n up
           rows of w13[e], reduced over H in chunks of block_k, fp32 accumulation; writes
           `a[r] = act(gate) * up` `[R, I]` in x's dtype (`gated_product`).
  down     grid (T, cdiv(H, block_h)). For each of token t's K slots, `w2[e] @ a[r]` for block_h
           hidden outputs over I in chunks of block_i with fp32 accumulation, then
           `sum_k topk_weights[t, k] * y_k` in fp32, slots in order (no atomics:
           deterministic); output in x's dtype. The slots and the chunks over I are unrolled (K
           and I are constexpr), so the loads of all K experts' tiles can be in flight at once
           without padding K to a power of two (top-8 plus a fused shared expert is K 9).

Rows, not experts, index the programs, so nothing depends on tensor values on the host: no sync,
static shapes, CUDA-graph capturable. Row r's programs for one output block are adjacent in launch
order, so rows that share an expert read its weight tile while it is still in L2.

Rounding, chosen to match the references (which round every GEMM output and the activation to x's
dtype): `gate` and `up` are rounded to x's dtype, and the activation's product is computed from
them as its torch module rounds it (`gated_product`, fused_activation.py: for SiLU `silu(gate)`
in fp32, rounded, times `up` in fp32, rounded; SiTU in fp32, rounded once) (`a`); each `y_k` is
rounded to x's dtype before the fp32 weighted sum. So the kernels differ from the references only
in the GEMMs' accumulation order (within a few ulps of x's dtype; fp32 summation order in the
weighted sum) and in the activation's approximate fp32 division and exponentials on the GPU (a
few fp32 ulps before its rounding, fused_activation.py). In fp32 every rounding is the identity.

Launch shapes: the defaults give a token's K rows `cdiv(I, 8)` gate/up programs each, which walk
H in unrolled steps (512 wide where 512 divides H, else 256), and H one-warp down programs, each
reading one row of all K experts' I (2 KB a slot at Kimi-Linear's I = 1024). They were chosen on
H100s (2026-12-06, `benchmarks/kernels/benchmark_moe.py --triton-configs`) at the two models'
expert shapes only: Kimi-Linear-48B's (H 2304, I 1024, top-8 + the fused shared expert), where
they read 89-96% of the copy bandwidth at 1-3 tokens, and Kimi-K3's at TP 8 (H 3584, I 384,
top-16; its latent MoE keeps the shared expert apart), 86% at one token. At two Kimi-K3 tokens
the earlier defaults (two-row, two-warp down programs above one token, 256-wide steps over H in
a loop) read 75-76%; these 95-97% (90% with a shared slot added). The 76-77% once measured for
them where another case ran first in the process was a transient in the first timing after new
weights are made, which the benchmarks' warm-up replays now keep out (docs/performance.md,
"Forty-eighth run").
"""

import torch

from vllm.model_executor.layers.fused_moe.fused_activation import (
    FusedActivation,
    fused_activation,
)
from vllm.triton_utils import cdiv, next_power_of_2, use_triton
from vllm.triton_utils.pdl import pdl_options, use_pdl

try:
    import triton
    import triton.language as tl

    from vllm.model_executor.layers.fused_moe.fused_activation import gated_product
    from vllm.triton_utils.pdl import pdl_wait
except ImportError:  # CPU-only installs without Triton never select this path
    triton = None

_DTYPES = (torch.bfloat16, torch.float16, torch.float32)

if triton is not None:

    @triton.jit
    def _gate_up_step(x_row, gate_ptrs, up_ptrs, kk, k0, hidden, n_ok, acc_gate, acc_up):
        k_ok = k0 + kk < hidden
        mask = n_ok[:, None] & k_ok[None, :]
        # x as a [BLOCK_N, BLOCK_K] tile of equal rows, in the weight tile's layout: a [BLOCK_K]
        # vector broadcast to it goes through shared memory and a barrier every step, which
        # keeps the next step's weight loads from being issued early.
        rows = tl.zeros([n_ok.shape[0], 1], dtype=tl.int32)
        xv = tl.load(x_row + rows + (k0 + kk)[None, :], mask=mask, other=0.0).to(tl.float32)
        gate = tl.load(gate_ptrs + k0, mask=mask, other=0.0)
        up = tl.load(up_ptrs + k0, mask=mask, other=0.0)
        acc_gate += tl.sum(gate.to(tl.float32) * xv, axis=1)
        acc_up += tl.sum(up.to(tl.float32) * xv, axis=1)
        return acc_gate, acc_up

    @triton.jit
    def _moe_gate_up_kernel(
        x_ptr, w13_ptr, ids_ptr, a_ptr,
        stride_xt, stride_it, stride_ik, stride_we, stride_wn, stride_ar,
        hidden, inter, beta, linear_beta,
        TOPK: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, HIDDEN: tl.constexpr,
        ACT: tl.constexpr, PDL: tl.constexpr = False,
    ):  # fmt: skip
        pdl_wait(PDL)
        # HIDDEN > 0 (= hidden): the steps over H are unrolled, so the compiler may issue the
        # weight loads of several steps before their reductions.
        r = tl.program_id(0)
        t = r // TOPK
        e = tl.load(ids_ptr + t * stride_it + (r % TOPK) * stride_ik).to(tl.int64)
        n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
        n_ok = n < inter
        kk = tl.arange(0, BLOCK_K)
        gate_ptrs = w13_ptr + e * stride_we + n[:, None] * stride_wn + kk[None, :]
        up_ptrs = gate_ptrs + inter * stride_wn
        x_row = x_ptr + t * stride_xt
        acc_gate = tl.zeros([BLOCK_N], dtype=tl.float32)
        acc_up = tl.zeros([BLOCK_N], dtype=tl.float32)
        if HIDDEN:
            for k0 in tl.static_range(0, HIDDEN, BLOCK_K):
                acc_gate, acc_up = _gate_up_step(
                    x_row, gate_ptrs, up_ptrs, kk, k0, HIDDEN, n_ok, acc_gate, acc_up
                )
        else:
            for k0 in range(0, hidden, BLOCK_K):
                acc_gate, acc_up = _gate_up_step(
                    x_row, gate_ptrs, up_ptrs, kk, k0, hidden, n_ok, acc_gate, acc_up
                )
        a = gated_product(acc_gate, acc_up, a_ptr.dtype.element_ty, ACT, beta, linear_beta)
        tl.store(a_ptr + r * stride_ar + n, a, mask=n_ok)

    @triton.jit
    def _moe_down_kernel(
        a_ptr, w2_ptr, ids_ptr, topk_w_ptr, out_ptr,
        stride_ar, stride_it, stride_ik, stride_wt, stride_wk, stride_we, stride_wh, stride_ot,
        hidden,
        INTER: tl.constexpr, TOPK: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_I: tl.constexpr,
        PDL: tl.constexpr = False,
    ):  # fmt: skip
        pdl_wait(PDL)
        # The slots and the steps over I are unrolled (all constexpr), so the compiler can issue
        # every slot's weight loads before the first reduction: no padding of K to a power of two.
        t = tl.program_id(0)
        h = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
        h_ok = h < hidden
        ii = tl.arange(0, BLOCK_I)
        dtype = out_ptr.dtype.element_ty
        out = tl.zeros([BLOCK_H], dtype=tl.float32)
        for j in tl.static_range(TOPK):
            e = tl.load(ids_ptr + t * stride_it + j * stride_ik).to(tl.int64)
            w_rows = w2_ptr + e * stride_we + h[:, None] * stride_wh
            a_row = a_ptr + (t * TOPK + j) * stride_ar
            acc = tl.zeros([BLOCK_H], dtype=tl.float32)
            for i0 in tl.static_range(0, INTER, BLOCK_I):
                i_ok = i0 + ii < INTER
                av = tl.load(a_row + i0 + ii, mask=i_ok, other=0.0).to(tl.float32)
                w = tl.load(w_rows + i0 + ii[None, :], mask=h_ok[:, None] & i_ok[None, :],
                            other=0.0)  # fmt: skip
                acc += tl.sum(w.to(tl.float32) * av[None, :], axis=1)
            weight = tl.load(topk_w_ptr + t * stride_wt + j * stride_wk).to(tl.float32)
            out += acc.to(dtype).to(tl.float32) * weight
        tl.store(out_ptr + t * stride_ot + h, out.to(dtype), mask=h_ok)


def triton_experts_supported(
    device: torch.device, dtype: torch.dtype, act_and_mul: torch.nn.Module
) -> bool:
    """Whether `moe_experts_triton` runs for `dtype` tensors on `device` with `act_and_mul`."""
    return use_triton(device) and dtype in _DTYPES and fused_activation(act_and_mul) is not None


def check_expert_shapes(
    x: torch.Tensor,
    w13: torch.Tensor,
    w2: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
) -> None:
    """The shapes every experts implementation needs (`experts.py`). Metadata only, so the
    call stays free of host syncs."""
    if x.dim() != 2:
        raise ValueError(f"x must be [T, H], got shape {tuple(x.shape)}")
    if w13.dim() != 3 or w13.shape[2] != x.shape[1] or w13.shape[1] % 2:
        raise ValueError(f"w13 must be [E, 2 * I, H={x.shape[1]}], got {tuple(w13.shape)}")
    expected_w2 = (w13.shape[0], x.shape[1], w13.shape[1] // 2)
    if tuple(w2.shape) != expected_w2:
        raise ValueError(f"w2 must be [E, H, I] = {expected_w2}, got {tuple(w2.shape)}")
    if topk_ids.dim() != 2 or topk_ids.shape[0] != x.shape[0]:
        raise ValueError(f"topk_ids must be [T={x.shape[0]}, K], got {tuple(topk_ids.shape)}")
    if topk_weights.shape != topk_ids.shape:
        raise ValueError(
            f"topk_weights shape {tuple(topk_weights.shape)} != topk_ids {tuple(topk_ids.shape)}"
        )


def check_power_of_two(name: str, value: int) -> None:
    if value < 1 or value & (value - 1):
        raise ValueError(f"{name} must be a positive power of two, got {value}")


def check_triton_operands(
    x: torch.Tensor,
    w13: torch.Tensor,
    w2: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    act_and_mul: torch.nn.Module,
    op: str,
) -> FusedActivation:
    """What the Triton expert kernels need beyond the shapes: dtypes, one device, unit inner
    strides, an activation the kernels fuse and a device Triton runs on; returns the kernels'
    form of the activation. `op` names the caller in the errors. Metadata only, so the call
    stays free of host syncs."""
    if x.dtype not in _DTYPES or w13.dtype != x.dtype or w2.dtype != x.dtype:
        raise ValueError(
            f"x, w13 and w2 must share one dtype of {_DTYPES}, got {x.dtype}, {w13.dtype}, "
            f"{w2.dtype}"
        )
    if topk_ids.dtype not in (torch.int32, torch.int64) or not topk_weights.is_floating_point():
        raise ValueError(
            f"topk_ids must be int32 / int64 and topk_weights floating point, got "
            f"{topk_ids.dtype}, {topk_weights.dtype}"
        )
    if len({t.device for t in (x, w13, w2, topk_weights, topk_ids)}) != 1:
        raise ValueError("x, w13, w2, topk_weights and topk_ids must be on one device")
    if x.stride(1) != 1 or w13.stride(2) != 1 or w2.stride(2) != 1:
        raise ValueError("x, w13 and w2 must have unit stride on their last dim")
    act = fused_activation(act_and_mul)
    if act is None:
        raise ValueError(
            f"act_and_mul must be SiluAndMul or SituAndMul (the activations the kernels fuse), "
            f"got {type(act_and_mul).__name__}; use select_experts_impl to pick a path"
        )
    if not use_triton(x.device):
        raise ValueError(
            f"{op} needs a CUDA / ROCm device or TRITON_INTERPRET=1 on CPU, got "
            f"{x.device}; use select_experts_impl to pick a path"
        )
    return act


def moe_experts_triton(
    x: torch.Tensor,
    w13: torch.Tensor,
    w2: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    act_and_mul: torch.nn.Module,
    *,
    block_n: int = 8,
    block_k: int | None = None,
    gate_up_warps: int = 4,
    gate_up_unroll: bool = True,
    block_h: int = 1,
    block_i: int | None = None,
    down_warps: int = 1,
) -> torch.Tensor:
    """Routed experts in two Triton launches; see the module docstring for shapes and numerics.

    `block_n` / `block_k` / `gate_up_warps` tile the gate/up kernel (intermediate columns per
    program, hidden chunk per step, warps); `block_h` / `block_i` / `down_warps` tile the down
    kernel (hidden outputs per program, intermediate chunk per step (default: all of I up to
    1024), warps). Powers of two. `gate_up_unroll` unrolls the gate/up kernel's steps over H
    (compiled per H). The defaults, at every token count: one hidden output and one warp per
    down program, the steps over H unrolled and 512 wide where 512 divides H, else 256 wide
    (Kimi-K3's H 3584 at TP 8: 512; Kimi-Linear's 2304: 256). They were chosen from sweeps at
    1-8 tokens on H100s at those two models' expert shapes (2026-12-06, docs/performance.md
    "Forty-sixth run"; at Kimi-K3's, 16-wide gate/up programs were within 1.5%); other shapes
    were not timed.
    """
    check_expert_shapes(x, w13, w2, topk_weights, topk_ids)
    tokens, hidden = x.shape
    inter = w13.shape[1] // 2
    act = check_triton_operands(
        x, w13, w2, topk_weights, topk_ids, act_and_mul, "moe_experts_triton"
    )
    if block_k is None:
        block_k = 512 if hidden % 512 == 0 else 256
    if block_i is None:
        block_i = min(next_power_of_2(inter), 1024)
    blocks = dict(block_n=block_n, block_k=block_k, gate_up_warps=gate_up_warps,
                  block_h=block_h, block_i=block_i, down_warps=down_warps)  # fmt: skip
    for name, value in blocks.items():
        check_power_of_two(name, value)
    topk = topk_ids.shape[1]
    out = torch.empty(tokens, hidden, dtype=x.dtype, device=x.device)
    if 0 in (tokens, topk, hidden, inter):
        return out.zero_()
    a = torch.empty(tokens * topk, inter, dtype=x.dtype, device=x.device)
    pdl = pdl_options(use_pdl(x.device))
    _moe_gate_up_kernel[(tokens * topk, cdiv(inter, block_n))](
        x, w13, topk_ids, a,
        x.stride(0), topk_ids.stride(0), topk_ids.stride(1), w13.stride(0), w13.stride(1),
        a.stride(0), hidden, inter, act.beta, act.linear_beta,
        TOPK=topk, BLOCK_N=block_n, BLOCK_K=block_k, HIDDEN=hidden if gate_up_unroll else 0,
        ACT=act.kind, num_warps=gate_up_warps, **pdl,
    )  # fmt: skip
    _moe_down_kernel[(tokens, cdiv(hidden, block_h))](
        a, w2, topk_ids, topk_weights, out,
        a.stride(0), topk_ids.stride(0), topk_ids.stride(1), topk_weights.stride(0),
        topk_weights.stride(1), w2.stride(0), w2.stride(1), out.stride(0), hidden,
        INTER=inter, TOPK=topk, BLOCK_H=block_h, BLOCK_I=block_i, num_warps=down_warps, **pdl,
    )  # fmt: skip
    return out
