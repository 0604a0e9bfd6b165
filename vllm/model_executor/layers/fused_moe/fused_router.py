"""The MoE router in one launch at decode sizes: the fp32 router logits and their grouped top-k
selection, which otherwise take two (`router_logits`, then `grouped_topk`, router.py).

``fused_router_topk(x, gate_weight, e_score_correction_bias, routing, semaphore, *,
config=None, static_weight=False)``
    ``x`` ``[T, H]`` bf16 / fp16 / fp32 with unit stride on H (any row stride), 1 <= T <=
    ``MAX_TOKENS`` (or 0: empty results, no launch); ``gate_weight`` ``[E, H]`` fp32 with unit
    stride on H; the bias and ``routing`` (a `RoutingParams`) as router.py's `grouped_topk`
    takes them; ``semaphore`` an int32 ``[1]`` tensor on x's device holding 0, owned by the
    caller and used by one launch at a time (the kernel leaves it at 0). Returns weights
    ``[T, top_k + S]`` fp32 and expert ids ``[T, top_k + S]`` int64 (S =
    ``routing.num_fused_shared_experts``): what ``grouped_topk(router_logits(x, gate_weight),
    ...)`` returns. Reference: ``fused_router_topk_ref``, that composition of the two
    references. CPU tensors take it unless ``TRITON_INTERPRET=1`` (``use_triton``).
    ``static_weight``: the gate weight is a layer's parameter, loaded before the PDL wait at one
    token (gemv.py, "Static weights"; ``KimiMoE`` passes it).

``use_fused_router(x, gate_weight)`` says whether a MoE layer should call it: T in 1..
``FUSED_ROUTER_MAX_T``, the strides above, Triton on the device, and NVIDIA rather than ROCm (the
ordering argument below is PTX's). ``KimiMoE`` (vllm/models/kimi_k3/amd/moe.py) owns one
semaphore per layer, so no two launches in flight ever share one.

``fused_norm_router_topk(x, residual, norm_weight, eps, gate_weight, e_score_correction_bias,
routing, semaphore, *, config=None, static_weight=False)``
    The decoder layer's residual add and RMSNorm before the MoE block, in the same launch:
    returns ``(h, new_residual, weights, ids)`` where ``h, new_residual =
    fused_add_rms_norm(x, residual, norm_weight, eps)`` (ops/rms_norm.py) and the routing is
    ``fused_router_topk(h, ...)``'s. ``residual`` is shaped and typed like ``x`` with unit stride
    on H, ``norm_weight`` ``[H]`` contiguous, H <= ``FUSED_NORM_MAX_HIDDEN``; ``h`` and
    ``new_residual`` are new contiguous tensors (the kernel reads ``x`` and ``residual`` in every
    program, so its outputs must not alias them). Reference: ``fused_norm_router_topk_ref``.
    ``use_fused_norm_router`` says when ``KimiMoE.forward_with_norm`` takes it.

Why: at batch 1 the two launches are ~4 us each on the H200, mostly latency, plus the launch gap
between them in the CUDA graph; one launch saves a gap, a ramp and the logits' round trip. The
norm before the router is another ~2 us launch per MoE layer (26 per Kimi-Linear decode step);
its row (H 2304) is small enough for every program to recompute.

Kernel: ``cdiv(E, block_n)`` programs (``FusedRouterConfig``; the default, 2 experts a program,
128 programs for Kimi-Linear's 256, is the shape of `gemv_fp32`'s default at these sizes, which
reads the 2.4 MB gate near HBM speed). Each program computes the fp32 logits of its experts for
all T tokens, walking H in ``block_h`` chunks, and stores them to an fp32 scratch ``[T, E]``. At
one token, where the program's experts' whole rows fit ``WHOLE_ROW_MAX_ELEMENTS``, it instead
loads them in one piece, with the token's row, as its first loads, and sums each logit over the
whole row: the chunk loop issues a chunk's loads only after the previous chunk's cross-warp sum
(a barrier), one HBM round trip per chunk on the launch's critical path. The
last program to finish then selects for every token: the one that reads ``num_programs - 1``
from an atomic increment of ``semaphore``. It reads all the logits back and runs router.py's
`grouped_topk_row`, the selection `_grouped_topk_kernel` runs, and sets ``semaphore`` back to 0.

Ordering (why the last program sees every logit, on NVIDIA, Triton 3.6 and 3.9):

* ``tl.debug_barrier()`` after the stores is a CTA barrier (``bar.sync``), which orders each
  thread's earlier memory operations before every thread's later ones in the program.
* ``tl.atomic_add`` on a scalar pointer is issued by one thread of the program, whose old value
  Triton hands to all threads through shared memory and a barrier: one increment per program.
  ``sem="acq_rel", scope="gpu"`` makes it ``atom.acq_rel.gpu``. Its release half is cumulative in
  the PTX memory model: the program's stores, ordered before it by the barrier, are released.
* The increments are read-modify-writes of one address, so each earlier release heads a release
  sequence that the last increment continues; its acquire half therefore synchronizes with every
  other program's release, and the barrier behind the broadcast extends that to all its threads.
  (The cooperative-groups grid barrier rests on the same bar.sync, one-thread gpu-scope fence
  and atomic pattern.) The logits are read back with ``cache_modifier=".cg"`` (L2; the SM's L1 is
  not coherent), in a loop that is not software-pipelined (``num_stages=1``), so no load is
  issued before the acquire.
* The sm_90 PTX of Triton 3.6.0 and 3.9.0 shows exactly that: ``bar.sync 0``, then
  ``atom.global.gpu.acq_rel.add.u32`` under a thread-0 predicate, its result through
  ``st.shared`` / ``bar.sync`` / ``ld.shared``, then ``ld.global.cg`` for the logits.
* No program waits for another: nothing assumes programs run concurrently, so any grid size is
  safe, and under Triton's CPU interpreter (programs in order) the pattern runs unchanged.
* The last program's count proves every other program has incremented, so its store of 0 races
  with nothing; the kernel's end orders it before the next launch on the stream and before the
  next replay of a CUDA graph holding it (with programmatic dependent launch, the next kernel's
  wait does: vllm/triton_utils/pdl.py; every program here waits before touching memory, but
  for the one-token path's static gate and norm weights, which no kernel writes).

The fused norm: every program first runs the norm kernel's arithmetic on each token's whole
row (one ``[next_pow2(H)]`` tile: ``s = x + residual`` rounded to x's dtype, the fp32 sum of
``s * s``, divided by H, plus eps, ``rsqrt``), keeping the rstd per token; program 0 alone
stores ``s`` and ``h = (s * rstd) * norm_weight`` rounded to x's dtype, early, while the others
compute (the last program, which selects, is the launch's tail). On the whole-row path every
program computes ``h`` that way and sums the logits on it. The chunk loop instead recomputes
each ``block_h`` chunk of ``h`` from x, residual and the norm weight, elementwise (the same
value in any layout), instead of loading it. Bit-identity with the norm kernel rests on the one
reduction: Triton's order for the sum follows the tile's layout, which follows the tile width,
the warps and the alignment of the row accesses. So the launch takes the norm kernel's warps
(``row_tile_warps``, 8 at H 2304: ``default_norm_config``; another count is a ValueError), and
with rows aligned alike (the model's: fresh 16-byte aligned activations) the sum compiles to the
same tree: checked in the sm_90 PTX of Triton 3.9 and by the GPU tests. The warps also set the
logits' summation order, so the routing is ``fused_router_topk(h, ..., config)``'s with the same
``config``, bit for bit; against ``default_config``'s 4 warps the logits may differ in the last
bits (summation order, below).

Numerics: the logits are computed as `gemv_fp32`'s multiply-and-sum path does: x converted to fp32
(exact), IEEE fp32 products (rounded, or fused into an FMA; never TF32), fp32 sums (a tree within a
chunk, chunks in order; on the whole-row path one tree over the row), so each logit is within (H +
2) * 2^-24 * sum_h |x_h w_h| of the exact dot product, as `router_logits` and `F.linear` are; the
three may differ from each other in the last bits (summation order). The selection is the same code
as `grouped_topk`'s kernel, so on the same logits the two choose the same ids, with the same weights
up to the order of the softmax and renormalising sums, which the warps per program set (bit for bit
under the interpreter; the tests' integer data gives exact logits, hence
``grouped_topk(router_logits(x, w), ...)``'s ids and, up to those sums, weights). Against the
reference, ids agree where the selection is decided by more than those logit errors, and the weights
differ by the logit error carried through sigmoid / softmax and the renormalisation (relative error
at most (2 for softmax) x (2 when renormalising) x the largest logit difference) plus a few ulps.

Host side: metadata checks only, static shapes, no sync: CUDA-graph capturable.
"""

from dataclasses import dataclass
from functools import cache

import torch

from vllm.model_executor.layers.fused_moe.router import (
    RoutingParams,
    check_logits_args,
    grouped_topk_ref,
    router_logits_ref,
)
from vllm.model_executor.layers.ops.rms_norm import fused_add_rms_norm_ref, row_tile_warps
from vllm.platforms import current_platform
from vllm.triton_utils import cdiv, next_power_of_2, use_triton
from vllm.triton_utils.launch import LaunchSpec, launch
from vllm.triton_utils.pdl import pdl_options, use_pdl

try:
    import triton
    import triton.language as tl

    from vllm.model_executor.layers.fused_moe.router import grouped_topk_row
    from vllm.triton_utils.pdl import pdl_wait
except ImportError:  # CPU-only installs without Triton use the torch reference
    triton = None

__all__ = [
    "FUSED_NORM_MAX_HIDDEN",
    "FUSED_ROUTER_MAX_T",
    "MAX_TOKENS",
    "FusedRouterConfig",
    "default_config",
    "default_norm_config",
    "fused_norm_router_topk",
    "fused_norm_router_topk_ref",
    "fused_router_topk",
    "fused_router_topk_ref",
    "use_fused_norm_router",
    "use_fused_router",
]

# Tokens up to which a MoE layer takes the fused op (`use_fused_router`); above it the two
# launches. benchmark_router.py --fused on the H200 (2026-12-01, sort-based selection, default
# config): 7.4 against 8.4 us at T = 1, but 11.8 against 10.0 at T = 2 and 19.6 against 12.2 at
# T = 4: the last program selects for the tokens one after another, the top-k kernel in parallel.
FUSED_ROUTER_MAX_T = 1
# The op's limit: every program computes all T tokens' logits, unrolled.
MAX_TOKENS = 16
# The widest norm the fused form takes: every program holds a token's whole row in registers
# beside its gate tile (the models' hidden sizes are <= 8192).
FUSED_NORM_MAX_HIDDEN = 8192
_X_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
# One token: a program holds its experts' whole gate rows in registers (``block_n`` x the padded
# hidden size, fp32) up to this many elements, loaded with the token's row; wider programs walk
# the row in ``block_h`` chunks. At the limit the tile alone is 64 registers a thread at 4 warps
# (Kimi-Linear's default, 2 x 4096, is at it: 96 registers in all on sm_90); twice that compiled
# to 181 registers and was never timed.
WHOLE_ROW_MAX_ELEMENTS = 8192


@dataclass(frozen=True)
class FusedRouterConfig:
    """Launch shape: ``block_n`` experts per program, ``block_h`` hidden elements per step of
    the logits loop, ``num_warps`` warps (the selection runs in one program of these warps).
    Powers of two."""

    block_n: int
    block_h: int
    num_warps: int = 4

    def check(self) -> None:
        """ValueError unless the config can be launched."""
        for name in ("block_n", "block_h", "num_warps"):
            value = getattr(self, name)
            if value < 1 or value & (value - 1):
                raise ValueError(f"{name} must be a positive power of two, got {value}")


def default_config(hidden: int) -> FusedRouterConfig:
    """`gemv_fp32`'s default launch shape at a few tokens: 2 experts and up to 1024 hidden
    elements (an 8 KB fp32 gate tile) per step of the chunk loop, 4 warps. At one token, where
    the 2 whole rows fit ``WHOLE_ROW_MAX_ELEMENTS`` (H <= 4096), a program loads them in one
    piece instead and ``block_h`` goes unused (module docstring)."""
    return FusedRouterConfig(2, min(1024, max(64, next_power_of_2(hidden))), 4)


def default_norm_config(hidden: int) -> FusedRouterConfig:
    """One expert per program, `default_config`'s hidden step, and the warps of the norm
    kernel's row tile (`row_tile_warps`), so that the fused norm's sum of squares runs in the
    norm kernel's layout (module docstring). One expert rather than two was measured on the
    chunk loop, before the whole-row path (which this config takes at one token up to H 8192):
    on the H200 at Kimi-Linear's sizes (benchmark_router.py --fused-norm, 26 layers
    graph-replayed, 2026-12-01, docs/performance.md "Eighth run") 8.49 us at one token against
    8.87 with two experts and 9.62 for the norm kernel then the fused router; on the whole-row
    path 6.29 us (call 56, "Sixteenth run")."""
    config = default_config(hidden)
    return FusedRouterConfig(1, config.block_h, row_tile_warps(next_power_of_2(hidden)))


if triton is not None:

    @triton.jit
    def _whole_row_loads(w_rows, norm_w_ptr, d, d_ok, n_ok, HAS_NORM: tl.constexpr):
        # The whole-row path's first loads: the program's gate rows and, with the norm, its
        # weight (fp32; an unused 0 without it).
        w_all = tl.load(w_rows + d[None, :], mask=n_ok[:, None] & d_ok[None, :], other=0.0)
        if HAS_NORM:
            nw = tl.load(norm_w_ptr + d, mask=d_ok, other=0.0).to(tl.float32)
        else:
            nw = tl.zeros([d.shape[0]], dtype=tl.float32)
        return w_all, nw

    @triton.jit
    def _fused_router_topk_kernel(
        x_ptr, res_ptr, norm_w_ptr, h_ptr, res_out_ptr,
        w_ptr, bias_ptr, scratch_ptr, weights_ptr, ids_ptr, semaphore_ptr,
        T, H, stride_xt, stride_rt, stride_we, stride_b, stride_wt, stride_it, scale, eps,
        BLOCK_T: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_H: tl.constexpr,
        EVEN_H: tl.constexpr, HAS_NORM: tl.constexpr, WHOLE_ROW: tl.constexpr,
        BLOCK_D: tl.constexpr,
        E: tl.constexpr, BLOCK_E: tl.constexpr, TOP_K: tl.constexpr,
        BLOCK_K: tl.constexpr, NUM_GROUPS: tl.constexpr, GROUP_SIZE: tl.constexpr,
        BLOCK_G: tl.constexpr, TOPK_GROUP: tl.constexpr, HAS_BIAS: tl.constexpr,
        SOFTMAX: tl.constexpr, RENORMALIZE: tl.constexpr, NUM_SHARED: tl.constexpr,
        PRELOAD: tl.constexpr = False, PDL: tl.constexpr = False,
    ):  # fmt: skip
        n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
        n_ok = n < E
        hh = tl.arange(0, BLOCK_H)
        cols = tl.arange(0, BLOCK_T)
        # Padded experts and tokens address row 0 under a false mask: no address leaves a tensor.
        w_rows = w_ptr + tl.where(n_ok, n, 0).to(tl.int64)[:, None] * stride_we
        if WHOLE_ROW:
            tl.static_assert(BLOCK_T == 1, "the whole-row path reads one token's row")
            # One token (BLOCK_T 1): the program's whole gate rows, and the norm weight, are
            # loaded first, beside the token's row, so that their round trip is the only one
            # before the sums (the chunk loop below waits for each chunk after the last one's
            # cross-warp sum). Static ones (PRELOAD: the layer's parameters, which no kernel in
            # flight writes) before the PDL wait, while the kernel before still runs
            # (vllm/triton_utils/pdl.py).
            d = tl.arange(0, BLOCK_D)
            d_ok = d < H
            if PRELOAD:
                w_all, nw = _whole_row_loads(w_rows, norm_w_ptr, d, d_ok, n_ok, HAS_NORM)
        pdl_wait(PDL)
        acc = tl.zeros([BLOCK_N, BLOCK_T], dtype=tl.float32)
        if WHOLE_ROW:
            if not PRELOAD:
                w_all, nw = _whole_row_loads(w_rows, norm_w_ptr, d, d_ok, n_ok, HAS_NORM)
            if not HAS_NORM:
                xi = tl.load(x_ptr + d, mask=d_ok, other=0.0).to(tl.float32)
                acc += tl.sum(w_all * xi[None, :], axis=1)[:, None]
        if HAS_NORM:
            # `_rms_norm_kernel`'s expression on its tile (BLOCK_D lanes under the same warps, the
            # rows aligned alike): the same fp32 sum of squares, hence the same rstd per token.
            d = tl.arange(0, BLOCK_D)
            d_ok = d < H
            rstds = tl.zeros([BLOCK_T], dtype=tl.float32)
            for i in tl.static_range(BLOCK_T):
                row = tl.where(i < T, i, 0).to(tl.int64)
                a = tl.load(x_ptr + row * stride_xt + d, mask=d_ok, other=0.0).to(tl.float32)
                r = tl.load(res_ptr + row * stride_rt + d, mask=d_ok, other=0.0).to(tl.float32)
                s = (a + r).to(res_out_ptr.dtype.element_ty)
                sf = s.to(tl.float32)
                rstd = tl.math.rsqrt(tl.sum(sf * sf, axis=0) / H + eps)
                rstds = tl.where(cols == i, rstd, rstds)
                if WHOLE_ROW:
                    normed = ((sf * rstd) * nw).to(h_ptr.dtype.element_ty)
                    acc += tl.sum(w_all * normed.to(tl.float32)[None, :], axis=1)[:, None]
                # One writer, the first program: its stores overlap the other programs' logits
                # instead of lengthening the last program's selection.
                if tl.program_id(0) == 0:
                    if i < T:
                        tl.store(res_out_ptr + row * H + d, s, mask=d_ok)
                        if not WHOLE_ROW:
                            nw = tl.load(norm_w_ptr + d, mask=d_ok, other=0.0).to(tl.float32)
                            normed = ((sf * rstd) * nw).to(h_ptr.dtype.element_ty)
                        tl.store(h_ptr + row * H + d, normed, mask=d_ok)
        if not WHOLE_ROW:
            for h0 in range(0, H, BLOCK_H):
                h = h0 + hh
                if EVEN_H:
                    w = tl.load(w_rows + h[None, :], mask=n_ok[:, None], other=0.0)
                else:
                    w_ok = n_ok[:, None] & (h < H)[None, :]
                    w = tl.load(w_rows + h[None, :], mask=w_ok, other=0.0)
                if HAS_NORM:
                    nw_h = tl.load(norm_w_ptr + h, mask=h < H, other=0.0).to(tl.float32)
                # One token at a time: no [BLOCK_N, BLOCK_T, BLOCK_H] product is ever live.
                for i in tl.static_range(BLOCK_T):
                    row = tl.where(i < T, i, 0).to(tl.int64)
                    row_ok = hh * 0 + i < T  # a block (the interpreter takes no scalar mask)
                    x_ok = row_ok if EVEN_H else row_ok & (h < H)
                    xi = tl.load(x_ptr + row * stride_xt + h, mask=x_ok, other=0.0).to(tl.float32)
                    if HAS_NORM:
                        # The token's normed chunk, elementwise as above (exact in any layout): the
                        # bf16 (x's dtype) values the unfused router would read back.
                        ri = tl.load(res_ptr + row * stride_rt + h, mask=x_ok, other=0.0)
                        si = (xi + ri.to(tl.float32)).to(res_out_ptr.dtype.element_ty)
                        si = si.to(tl.float32)
                        rstd_i = tl.sum(tl.where(cols == i, rstds, 0.0), axis=0)
                        xi = ((si * rstd_i) * nw_h).to(h_ptr.dtype.element_ty).to(tl.float32)
                    part = tl.sum(w * xi[None, :], axis=1)
                    acc = tl.where(cols[None, :] == i, acc + part[:, None], acc)
        tl.store(
            scratch_ptr + cols[None, :] * E + n[:, None], acc,
            mask=n_ok[:, None] & (cols < T)[None, :],
        )  # fmt: skip

        # The module docstring argues the ordering of these four steps.
        tl.debug_barrier()
        count = tl.atomic_add(semaphore_ptr, 1, sem="acq_rel", scope="gpu")
        if count == tl.num_programs(0) - 1:
            offs = tl.arange(0, BLOCK_E)
            safe = tl.minimum(offs, E - 1)
            for t in tl.range(0, T, num_stages=1):
                logits = tl.load(
                    scratch_ptr + t * E + safe, mask=offs < E, other=0.0, cache_modifier=".cg"
                )
                grouped_topk_row(
                    logits, bias_ptr, stride_b, weights_ptr + t * stride_wt,
                    ids_ptr + t * stride_it, scale,
                    E, BLOCK_E, TOP_K, BLOCK_K, NUM_GROUPS, GROUP_SIZE, BLOCK_G, TOPK_GROUP,
                    HAS_BIAS, SOFTMAX, RENORMALIZE, NUM_SHARED,
                )  # fmt: skip
            tl.store(semaphore_ptr, 0)


@cache
def _spec(
    block_t: int,
    config: FusedRouterConfig,
    even_h: bool,
    has_norm: bool,
    whole_row: bool,
    block_d: int,
    experts: int,
    top_k: int,
    columns: int,
    groups: int,
    topk_group: int,
    has_bias: bool,
    softmax: bool,
    renormalize: bool,
    shared: int,
    pdl: bool,
    preload: bool = False,
) -> LaunchSpec:
    """Constexprs and options (``block_d``: the padded row, 0 where neither the norm nor the
    whole-row path reads it; ``preload``: the whole-row path's static gate and norm weights
    loaded before the PDL wait); cached: the spec holds the compiled kernels."""
    return LaunchSpec(
        BLOCK_T=block_t, BLOCK_N=config.block_n, BLOCK_H=config.block_h, EVEN_H=even_h,
        HAS_NORM=has_norm, WHOLE_ROW=whole_row, BLOCK_D=max(block_d, 1), E=experts,
        BLOCK_E=next_power_of_2(max(experts, columns)), TOP_K=top_k,
        BLOCK_K=next_power_of_2(columns), NUM_GROUPS=groups, GROUP_SIZE=experts // groups,
        BLOCK_G=next_power_of_2(groups), TOPK_GROUP=topk_group, HAS_BIAS=has_bias,
        SOFTMAX=softmax, RENORMALIZE=renormalize, NUM_SHARED=shared, PRELOAD=preload,
        num_warps=config.num_warps, **pdl_options(pdl),
    )  # fmt: skip


def _whole_row(tokens: int, config: FusedRouterConfig, hidden: int) -> bool:
    """Whether a launch takes the one-token path that loads each program's whole gate rows."""
    return tokens == 1 and config.block_n * next_power_of_2(hidden) <= WHOLE_ROW_MAX_ELEMENTS


def fused_router_topk_ref(
    x: torch.Tensor,
    gate_weight: torch.Tensor,
    e_score_correction_bias: torch.Tensor | None,
    routing: RoutingParams,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The torch reference: ``grouped_topk_ref(router_logits_ref(x, gate_weight), ...)``."""
    return grouped_topk_ref(router_logits_ref(x, gate_weight), e_score_correction_bias, routing)


def fused_norm_router_topk_ref(
    x: torch.Tensor,
    residual: torch.Tensor,
    norm_weight: torch.Tensor,
    eps: float,
    gate_weight: torch.Tensor,
    e_score_correction_bias: torch.Tensor | None,
    routing: RoutingParams,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The torch reference: ``fused_add_rms_norm_ref``, then ``fused_router_topk_ref`` of the
    normed rows."""
    h, new_residual = fused_add_rms_norm_ref(x, residual, norm_weight, eps)
    weights, ids = fused_router_topk_ref(h, gate_weight, e_score_correction_bias, routing)
    return h, new_residual, weights, ids


def _check_args(
    x: torch.Tensor,
    gate_weight: torch.Tensor,
    e_score_correction_bias: torch.Tensor | None,
    routing: RoutingParams,
    semaphore: torch.Tensor,
) -> None:
    check_logits_args(x, gate_weight)
    routing.check_inputs(gate_weight.shape[0], x.device, e_score_correction_bias, "gate_weight")
    if x.shape[0] > MAX_TOKENS:
        raise ValueError(f"fused_router_topk takes at most {MAX_TOKENS} tokens, got {x.shape[0]}")
    if x.shape[1] > 1 and (x.stride(1) != 1 or gate_weight.stride(1) != 1):
        raise ValueError(
            f"x and gate_weight must have unit stride on H, got strides {x.stride()} and "
            f"{gate_weight.stride()}"
        )
    if semaphore.dtype != torch.int32 or tuple(semaphore.shape) != (1,):
        raise ValueError(
            f"semaphore must be an int32 [1] tensor, got {semaphore.dtype} {tuple(semaphore.shape)}"
        )
    if semaphore.device != x.device:
        raise ValueError(f"semaphore is on {semaphore.device}, x on {x.device}")


def _norm_args_error(x: torch.Tensor, residual: torch.Tensor, norm_weight: torch.Tensor) -> str:
    """What makes `(x, residual, norm_weight)` unfit for the fused norm ("" if nothing): the one
    list of conditions that the op's checks and `use_fused_norm_router` share."""
    hidden = x.shape[1]
    if not 0 < hidden <= FUSED_NORM_MAX_HIDDEN:
        return f"fused_norm_router_topk takes H in [1, {FUSED_NORM_MAX_HIDDEN}], got {hidden}"
    if residual.shape != x.shape or residual.dtype != x.dtype:
        return (
            f"residual must match x ({tuple(x.shape)} {x.dtype}), got {tuple(residual.shape)} "
            f"{residual.dtype}"
        )
    if hidden > 1 and residual.stride(1) != 1:
        return f"residual must have unit stride on H, got strides {residual.stride()}"
    if tuple(norm_weight.shape) != (hidden,) or norm_weight.dtype not in _X_DTYPES:
        return (
            f"norm_weight must be [{hidden}] bf16 / fp16 / fp32, got "
            f"{tuple(norm_weight.shape)} {norm_weight.dtype}"
        )
    if hidden > 1 and norm_weight.stride(0) != 1:
        return f"norm_weight must be contiguous, got stride {norm_weight.stride()}"
    for name, t in (("residual", residual), ("norm_weight", norm_weight)):
        if t.device != x.device:
            return f"{name} is on {t.device}, x on {x.device}"
    return ""


def _check_norm_args(x: torch.Tensor, residual: torch.Tensor, norm_weight: torch.Tensor) -> None:
    error = _norm_args_error(x, residual, norm_weight)
    if error:
        raise ValueError(error)


def _launch(
    x: torch.Tensor,
    norm: tuple[torch.Tensor, torch.Tensor, float] | None,
    gate_weight: torch.Tensor,
    e_score_correction_bias: torch.Tensor | None,
    routing: RoutingParams,
    semaphore: torch.Tensor,
    config: FusedRouterConfig,
    static_weight: bool,
) -> tuple[torch.Tensor, ...]:
    """The kernel's (weights, ids), after (h, new residual) with ``norm`` = (residual, norm
    weight, eps); arguments checked."""
    tokens, hidden = x.shape
    experts = gate_weight.shape[0]
    columns = routing.columns
    weights = torch.empty(tokens, columns, dtype=torch.float32, device=x.device)
    ids = torch.empty(tokens, columns, dtype=torch.int64, device=x.device)
    outputs = (weights, ids)
    if norm is not None:
        residual, norm_weight, eps = norm
        h = torch.empty(tokens, hidden, dtype=x.dtype, device=x.device)
        res_out = torch.empty_like(h)
        outputs = (h, res_out, weights, ids)
    if tokens == 0:
        return outputs
    if norm is None:  # the norm's pointers go unread: any tensor
        residual, norm_weight, eps, h, res_out = x, x, 0.0, x, x
    scratch = torch.empty(tokens, experts, dtype=torch.float32, device=x.device)
    groups = routing.num_expert_group
    bias = e_score_correction_bias
    block_d = next_power_of_2(hidden)
    whole_row = _whole_row(tokens, config, hidden)
    spec = _spec(
        next_power_of_2(tokens), config, hidden % config.block_h == 0, norm is not None,
        whole_row, block_d if norm is not None or whole_row else 0, experts, routing.top_k,
        columns, groups, routing.topk_group if groups > 1 else 1, bias is not None,
        routing.scoring_func == "softmax", bool(routing.renormalize),
        routing.num_fused_shared_experts, use_pdl(x.device), static_weight and whole_row,
    )  # fmt: skip
    launch(
        _fused_router_topk_kernel, (cdiv(experts, config.block_n), 1, 1),
        (x, residual, norm_weight, h, res_out,
         gate_weight, bias if bias is not None else scratch, scratch, weights, ids, semaphore,
         tokens, hidden, x.stride(0), residual.stride(0), gate_weight.stride(0),
         bias.stride(0) if bias is not None else 0, weights.stride(0), ids.stride(0),
         float(routing.routed_scaling_factor), float(eps)),
        spec,
    )  # fmt: skip
    return outputs


def fused_router_topk(
    x: torch.Tensor,
    gate_weight: torch.Tensor,
    e_score_correction_bias: torch.Tensor | None,
    routing: RoutingParams,
    semaphore: torch.Tensor,
    *,
    config: FusedRouterConfig | None = None,
    static_weight: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(weights ``[T, top_k + S]`` fp32, ids ``[T, top_k + S]`` int64) of
    ``grouped_topk(router_logits(x, gate_weight), ...)`` in one launch (module docstring).
    ``config`` overrides ``default_config`` (benchmark sweeps). ``static_weight``: the gate
    weight is a layer's parameter, which no kernel in flight writes, so one token's launch loads
    its gate rows before the PDL wait (gemv.py, "Static weights")."""
    _check_args(x, gate_weight, e_score_correction_bias, routing, semaphore)
    if config is None:
        config = default_config(x.shape[1])
    else:
        config.check()
    if not use_triton(x.device):
        return fused_router_topk_ref(x, gate_weight, e_score_correction_bias, routing)
    return _launch(
        x, None, gate_weight, e_score_correction_bias, routing, semaphore, config, static_weight
    )


def fused_norm_router_topk(
    x: torch.Tensor,
    residual: torch.Tensor,
    norm_weight: torch.Tensor,
    eps: float,
    gate_weight: torch.Tensor,
    e_score_correction_bias: torch.Tensor | None,
    routing: RoutingParams,
    semaphore: torch.Tensor,
    *,
    config: FusedRouterConfig | None = None,
    static_weight: bool = False,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(h, new_residual, weights, ids)``: ``h, new_residual = fused_add_rms_norm(x, residual,
    norm_weight, eps)`` and ``fused_router_topk(h, ...)``, in one launch (module docstring).
    ``h`` and ``new_residual`` are new contiguous ``[T, H]`` tensors in x's dtype. ``config``
    overrides ``default_norm_config``; its warps must be the norm's (``row_tile_warps``).
    ``static_weight``: as ``fused_router_topk``'s, for the gate and norm weights both."""
    _check_args(x, gate_weight, e_score_correction_bias, routing, semaphore)
    _check_norm_args(x, residual, norm_weight)
    hidden = x.shape[1]
    if config is None:
        config = default_norm_config(hidden)
    else:
        config.check()
        warps = row_tile_warps(next_power_of_2(hidden))
        if config.num_warps != warps:
            raise ValueError(
                f"with the norm, num_warps must be the norm kernel's {warps} at H {hidden} "
                f"(its sum of squares follows the warps), got {config.num_warps}"
            )
    bias = e_score_correction_bias
    if not use_triton(x.device):
        return fused_norm_router_topk_ref(x, residual, norm_weight, eps, gate_weight, bias, routing)
    return _launch(
        x, (residual, norm_weight, eps), gate_weight, bias, routing, semaphore, config,
        static_weight,
    )  # fmt: skip


def use_fused_router(x: torch.Tensor, gate_weight: torch.Tensor) -> bool:
    """Whether a MoE layer routes `x` with `fused_router_topk` (module docstring) rather than
    `router_logits` and `grouped_topk`."""
    return (
        use_triton(x.device)
        and not (x.is_cuda and current_platform.is_rocm())
        and x.dim() == 2
        and 0 < x.shape[0] <= FUSED_ROUTER_MAX_T
        and x.dtype in _X_DTYPES
        and x.stride(1) == 1
        and gate_weight.stride(1) == 1
    )


def use_fused_norm_router(
    x: torch.Tensor, residual: torch.Tensor, norm_weight: torch.Tensor, gate_weight: torch.Tensor
) -> bool:
    """Whether a MoE layer runs the residual add and RMSNorm before it inside its router's launch
    (`fused_norm_router_topk`) rather than as a launch of its own: where `use_fused_router`
    holds, for a residual shaped and typed like `x` and a norm of H up to
    ``FUSED_NORM_MAX_HIDDEN``. Row strides that 16 divides, as the model's rows have: the norm
    kernel's row address is `row * stride`, whose alignment Triton knows (and lays the loads out
    by) only for such strides, while the fused launch's row 0 is always aligned; so only then do
    the two order the sum of squares alike."""
    return (
        use_fused_router(x, gate_weight)
        and not _norm_args_error(x, residual, norm_weight)
        and x.stride(0) % 16 == 0
        and residual.stride(0) % 16 == 0
    )
