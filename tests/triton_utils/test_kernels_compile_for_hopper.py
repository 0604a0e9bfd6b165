"""Every Triton kernel of the fork compiles for sm_90 (Hopper), with the launches its op makes,
on a machine without a GPU.

CPU tests run the kernels under ``TRITON_INTERPRET=1``, which never runs Triton's code generator:
a kernel the interpreter runs correctly can still be rejected by the compiler (the KDA decode
epilogue bound one name to a ``[D]`` and a ``[1, D]`` tensor in the two branches of an ``if``;
only the H200 found it). Here each op's public function is called at Kimi-Linear's sizes and at
small ones, with the kernels (the registry of tests/conftest.py) replaced by recorders that keep
each launch's arguments and options instead of running it. Every recorded variant is then
compiled to a cubin for sm_90 (Triton's bundled ptxas, no driver) in a child process
(tests/triton_utils/sm90_compile.py) and has to fit the H200's shared memory.
"""

import functools
import importlib
import inspect
import json
import os
import re
import shutil
import subprocess
import sys
from dataclasses import astuple, replace
from pathlib import Path

import pytest
import torch
from counted_kernels import COUNTED_KERNELS
from triton.tools.tensor_descriptor import TensorDescriptor

import vllm.models.kimi_k3.amd.ops.fused_kda_decode as kda_decode_module
import vllm.models.kimi_k3.amd.ops.mla_decode as mla_decode_module
from vllm.model_executor.kernels.linear.gemv import gemv, gemv_batched, gemv_fp8, gemv_fp32
from vllm.model_executor.kernels.linear.gemv_config import WIDE_TILE_MIN_N, GemvConfig
from vllm.model_executor.kernels.linear.rms_norm_gemv import MAX_REGISTERS, fused_add_rms_norm_gemv
from vllm.model_executor.layers.activation import SiluAndMul, SituAndMul
from vllm.model_executor.layers.fused_moe.experts_triton import moe_experts_triton
from vllm.model_executor.layers.fused_moe.experts_triton_grouped import (
    LARGE_PREFILL_TILES_FROM_ROWS,
    PREFILL_TILES_ABOVE_ROWS,
    default_tiles,
    moe_experts_triton_grouped,
)
from vllm.model_executor.layers.fused_moe.fused_router import (
    FusedRouterConfig,
    fused_norm_router_topk,
    fused_router_topk,
)
from vllm.model_executor.layers.fused_moe.gather_rows import (
    DEFAULT_GATHER_ROWS_CONFIG,
    GatherRowsConfig,
    gather_rows,
)
from vllm.model_executor.layers.fused_moe.group_rows import group_rows
from vllm.model_executor.layers.fused_moe.router import RoutingParams, grouped_topk_triton
from vllm.model_executor.layers.fused_moe.weighted_sum import moe_weighted_sum
from vllm.model_executor.layers.ops.rms_norm import fused_add_rms_norm, rms_norm
from vllm.model_executor.layers.ops.silu_and_mul import silu_and_mul
from vllm.model_executor.layers.quantization.utils.fp8_per_token import per_token_fp8_quant
from vllm.models.kimi_k3.amd.ops.causal_conv1d import (
    DEFAULT_PREFILL_CONFIG,
    Conv1dPrefillConfig,
    causal_conv1d_prefill,
)
from vllm.models.kimi_k3.amd.ops.fused_kda_decode import (
    KdaDecodeConfig,
    LowRankProj,
    fused_kda_decode,
    kda_decode_config,
)
from vllm.models.kimi_k3.amd.ops.fused_kda_decode_config import gate_proj_tiling
from vllm.models.kimi_k3.amd.ops.mla_cache_write import mla_cache_write
from vllm.models.kimi_k3.amd.ops.mla_decode import launch_mla_decode
from vllm.models.kimi_k3.amd.ops.mla_decode_config import (
    DECODE_COUNTERS,
    MlaDecodeConfig,
    mla_decode_config,
)
from vllm.models.kimi_k3.amd.ops.mla_prefill import mla_prefill_dense_operands, mla_prefill_key
from vllm.models.kimi_k3.amd.ops.rmsnorm_gated_fp8_per_token import rmsnorm_gated_fp8_per_token
from vllm.v1.sample.ops.argmax import argmax

# The MLA decode kernels are launched by tests of their own, outside the counted registry.
KERNELS = {
    **COUNTED_KERNELS,
    "vllm.models.kimi_k3.amd.ops.mla_decode": (
        "_mla_decode_split_kernel", "_mla_decode_merge_kernel",
    ),
}  # fmt: skip
# Variants compiled per kernel: the first launches with distinct constexprs, dtypes and options
# (the ops are driven at Kimi-Linear's sizes first). A compile takes 0.1-3 s on 2 cores.
MAX_VARIANTS = 8
# The grouped experts' gate/up kernel 16 (decode and prefill tiles, pointer and TMA loads, tail
# tiles of 16, 32 and 64 rows, each at two TOPK; SiTU on the decode tiles at two TOPK); the
# GEMV's one kernel runs two algorithms (multiply-and-sum, tl.dot) on three weight dtypes, and
# batched (MLA's absorbs: 3 more), and the one-row wide tile, the layers' launches with static
# weights (PRELOAD) beside the plain ones; the KDA
# decode epilogue 9 (norm, quantized, shift-only; three shift tiles; chunked norm), its main
# kernel 13 (8 launches without the gate projections, one of them with the state evicted first, 5
# with them); the MLA decode split kernel 10 (4 with one latent chunk, 6 with 2 or 4).
MAX_VARIANTS_OF = {
    "_gemv_kernel": 31, "_kda_decode_epilogue_kernel": 10, "_fused_kda_decode_kernel": 13,
    "_mla_decode_split_kernel": 10, "_moe_grouped_gate_up_kernel": 16,
}  # fmt: skip


# The KDA decode's state policy in the PTX of Triton 3.6 and 3.9 for sm_90: an L2 policy made
# with `createpolicy`, used as the cache hint of the state's loads and stores, which also carry
# the L1 qualifier.
_EVICT_FIRST_PTX = [
    "createpolicy.fractional.L2::evict_first",
    "ld.global.L1::evict_first.L2::cache_hint",
    "st.global.L1::evict_first.L2::cache_hint",
]


# A TMA tensor load in sm_90 PTX (Triton 3.6 and 3.9).
_TMA_LOAD_PTX = "cp.async.bulk.tensor"

# Programmatic dependent launch (vllm/triton_utils/pdl.py) in sm_90 PTX: the wait, then the
# signal, both before the first instruction that touches global memory, and no branch or return
# before the wait (a program must not exit, or skip it, before waiting).
_PDL_WAIT, _PDL_SIGNAL = "griddepcontrol.wait", "griddepcontrol.launch_dependents"
_GLOBAL_ACCESS_PTX = ["ld.global", "st.global", "atom.", "red.global", "cp.async"]
# Static weights' loads (PRELOAD) are the one access allowed before the wait.
_WRITE_PTX = [s for s in _GLOBAL_ACCESS_PTX if s != "ld.global"]
_DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4, "float8_e4m3fn": 1}


def _preloaded_loads(launch: dict) -> int:
    """The 16-byte global loads a PRELOAD launch's static tiles take a thread (each tile spread
    over all the program's threads): gemv.py's weight tile, the fused router's gate rows and norm
    weight. The PTX must hold exactly these before the wait, so that no load of what the kernel
    before writes (the rows, their scales) moves ahead of it."""
    args = launch["args"]
    lanes = 16 * 32 * launch["options"]["num_warps"]

    def loads(elements: int, tensor: str) -> int:
        return -(-elements * _DTYPE_BYTES[args[tensor]["tensor"]] // lanes)

    if launch["kernel"] == "_fused_router_topk_kernel":
        gate = loads(args["BLOCK_N"] * args["BLOCK_D"], "w_ptr")
        return gate + (loads(args["BLOCK_D"], "norm_w_ptr") if args["HAS_NORM"] else 0)
    return loads(args["BLOCK_N"] * args["BLOCK_K"], "w_ptr")


_EXIT_PTX = ["bra ", "bra.uni", "ret;", "exit;"]


def _ptx_checks(launch: dict) -> dict:
    """What the compiled PTX of a launch must hold or lack, where a constexpr asks for it: the
    KDA decode's state policy reaches its loads and stores; the grouped experts' TMA flag gives
    TMA loads, and only it; with PDL the program waits and then signals before any global memory
    access, and without it neither. Every kernel's opt-outs of Triton's specialization narrow
    none of its global accesses (sm90_compile.py), except where `opt_outs_may_narrow` says why."""
    checks = {"ptx_has": [], "ptx_lacks": []}
    if launch["args"]["PDL"] and launch["args"].get("PRELOAD"):
        # The static tiles' loads before the wait and the rows' after it, nothing else before.
        checks["ptx_has"] += [_PDL_WAIT, _PDL_SIGNAL]
        checks["ptx_order"] = [_PDL_WAIT, _PDL_SIGNAL, _WRITE_PTX, _EXIT_PTX]
        checks["loads_around"] = [_PDL_WAIT, _preloaded_loads(launch)]
    elif launch["args"]["PDL"]:
        checks["ptx_has"] += [_PDL_WAIT, _PDL_SIGNAL]
        checks["ptx_order"] = [_PDL_WAIT, _PDL_SIGNAL, _GLOBAL_ACCESS_PTX, _EXIT_PTX]
    else:
        checks["ptx_lacks"].append("griddepcontrol")
    if launch["kernel"] == "_fused_kda_decode_kernel":
        if launch["args"]["EVICT"] == "evict_first":
            checks["ptx_has"] += _EVICT_FIRST_PTX
        else:
            checks["ptx_lacks"].append("evict_first")
    if launch["kernel"] in ("_moe_grouped_gate_up_kernel", "_moe_grouped_down_kernel"):
        checks["ptx_has" if launch["args"]["TMA"] else "ptx_lacks"].append(_TMA_LOAD_PTX)
    if launch["kernel"] == "_mla_decode_merge_kernel":
        # Each split's multiply-add is one fma, as in the one-launch merge (same bits; both
        # launches ask for FP contraction); at two splits LLVM once folded the selects on a
        # split's liveness into a separate multiply. With every split unrolled, no branch:
        # every load goes out with the length's, none waits for it. A dead split's partial is
        # -0 (0f80000000), which Triton 3.6 would fold to +0 if written as a literal.
        checks["ptx_has"] += ["fma.rn.f32", "0f80000000"]
        checks["ptx_lacks"] += ["mul.f32", "mul.rn.f32", "mul.ftz.f32", "mul.rn.ftz.f32"]
        if launch["args"]["SPLITS"] == launch["args"]["UNROLLED"]:
            checks["ptx_lacks"] += ["bra ", "bra.uni"]
    if "maxnreg" in launch["options"]:  # the cap reaches the code generator
        checks["ptx_has"].append(f".maxnreg {launch['options']['maxnreg']}")
    if launch["kernel"] == "_fused_kda_decode_kernel":
        # The conv windows' shift stores wait for every warp's loads of them (a race otherwise).
        checks["stores_after"] = "bar.sync"
    loads_first = _loads_before_barrier(launch)
    if loads_first is not None:
        checks["loads_before_barrier"] = loads_first
    args = launch["args"]
    if launch["kernel"] == "_gather_rows_kernel" and (
        (args["BLOCK_ROWS"], args["BLOCK_COLS"], launch["options"]["num_warps"])
        != astuple(DEFAULT_GATHER_ROWS_CONFIG)
        or args["order_ptr"]["tensor"] != "int32"
    ):
        # Its opt-out of `num_rows` narrows the index load where a thread holds several indices
        # (the benchmark's 4-row tiles, int64 indices): 16-128 bytes a program, which every
        # thread reads from L1, beside kilobytes of rows. Not in the engine's launch (the
        # default tiles, group_rows' int32 indices), which keeps every access.
        checks["opt_outs_may_narrow"] = True
    return checks


# Where a load must not wait: a CTA barrier (a cross-warp sum, a layout conversion through
# shared memory) or a branch (on a loaded value: the cache write's slot).
_BARRIER_PTX = [r"bar\.sync"]
_BRANCH_PTX = [r"\sbra(\.uni)?\s"]


def _loads_before_barrier(launch: dict) -> tuple[list[str], str] | None:
    """``(waits, upto)`` where a decode-size launch must have issued every global load before
    the first of ``waits`` (a load after a barrier waits for all warps, hence for the loads
    before it; one after a branch on a loaded value waits for that value: one more HBM or L2
    round trip), up to ``upto`` ("" for the end): the fused router's one-token path up to its
    semaphore, the MoE gate/up at one token (steps over H unrolled), the GEMV's multiply-and-sum
    rows when K is one step (the check reads the PTX text, which holds a loop's body once), the
    RMSNorm where it spans warps, the MLA cache write before its slot's branch, and the fused
    KDA decode's V-split, the engine's launch at Kimi-Linear's head size (its state tile, and at
    small batch its gate projections, would otherwise wait behind the conv and norm sums; the
    single kernel keeps its tile and gate projections after them, fused_kda_decode.py says
    why); None elsewhere."""
    name, args = launch["kernel"], launch["args"]
    if name == "_fused_router_topk_kernel" and args["WHOLE_ROW"]:
        return _BARRIER_PTX, "atom."
    if name == "_moe_gate_up_kernel" and args["HIDDEN"]:
        return _BARRIER_PTX, ""
    if (
        name == "_gemv_kernel"
        and not args["USE_DOT"]
        and args["BLOCK_M"] <= 2
        and args["k_per_split"] <= args["BLOCK_K"]
    ):
        return _BARRIER_PTX, ""
    if name == "_rms_norm_kernel" and launch["options"]["num_warps"] > 1:
        return _BARRIER_PTX, ""
    if name == "_mla_cache_write_kernel":
        return _BRANCH_PTX, ""
    if (
        name == "_fused_kda_decode_kernel"
        and args["SPLIT"]
        and (args["WHOLE_RANK"] or not (args["RANK_F"] or args["RANK_G"]))
    ):
        return _BARRIER_PTX, ""
    return None


H200_SMS = 132
FP8 = torch.float8_e4m3fn  # NVIDIA's FP8 (the interpreter machine's platform may differ)

pytestmark = pytest.mark.skipif(
    os.environ.get("TRITON_INTERPRET") != "1", reason="records launches under the interpreter"
)


def _has_nvidia_backend() -> bool:
    try:
        from triton.backends import backends
    except ImportError:
        return False
    nvidia = backends.get("nvidia")
    if nvidia is None:
        return False
    bundled = Path(inspect.getfile(nvidia.compiler)).parent / "bin" / "ptxas"
    return bundled.exists() or shutil.which("ptxas") is not None


def _describe(value):
    """A launch argument as JSON: tensors by dtype and 16-byte alignment, like Triton keys them;
    TMA descriptors by dtype and block shape."""
    if isinstance(value, torch.Tensor):
        dtype = str(value.dtype).removeprefix("torch.")
        return {"tensor": dtype, "aligned": value.data_ptr() % 16 == 0}
    if isinstance(value, TensorDescriptor):
        dtype = str(value.base.dtype).removeprefix("torch.")
        return {"tensordesc": dtype, "block": list(value.block_shape)}
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    raise TypeError(f"cannot record a {type(value).__name__} launch argument")


class _RecordedKernel:
    """Stands in for a kernel: `kernel[grid](...)` records the launch and runs nothing (no op
    reads a kernel's output on the host, so the rest of the op runs on unwritten buffers)."""

    def __init__(self, module: str, name: str, kernel, launches: list[dict]) -> None:
        self._module, self._name, self._kernel, self._launches = module, name, kernel, launches
        self._signature = inspect.signature(kernel.fn)
        self._seen: set[str] = set()

    def __getitem__(self, grid):
        return self._record

    def _record(self, *args, **kwargs) -> None:
        params = self._signature.parameters
        options = {k: v for k, v in kwargs.items() if k not in params}
        bound = self._signature.bind(*args, **{k: v for k, v in kwargs.items() if k in params})
        bound.apply_defaults()
        values = {name: _describe(value) for name, value in bound.arguments.items()}
        variant = json.dumps(
            [
                options,
                [v for n, v in values.items() if "constexpr" in str(params[n].annotation)],
                [
                    v.get("tensor", v.get("tensordesc"))
                    for v in values.values()
                    if isinstance(v, dict)
                ],
            ]
        )
        limit = MAX_VARIANTS_OF.get(self._name, MAX_VARIANTS)
        if variant in self._seen or len(self._seen) >= limit:
            return
        self._seen.add(variant)
        self._launches.append(
            dict(module=self._module, kernel=self._name, args=values, options=options)
        )

    def __getattr__(self, attr):
        return getattr(self._kernel, attr)


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _drive_kda_decode(n: int, heads: int, d: int, configs, norm: bool = True, rank: int = 0):
    """`rank`: raw_g and gate as `LowRankProj` of that rank (the gate projections in the kernel)."""
    gen = _gen(n + heads + d)
    proj = torch.randn(n, 4 * heads * d, generator=gen).to(torch.bfloat16)
    low_rank = torch.randn(n, 2 * rank + 8, generator=gen).to(torch.bfloat16)

    def factors(i):
        weight = torch.randn(heads * d, rank, generator=gen).to(torch.bfloat16)
        return LowRankProj(low_rank[:, i * rank : (i + 1) * rank], weight)

    def step():
        inputs = dict(
            mixed_qkv=proj[:, : 3 * heads * d],
            conv_weight=torch.randn(3 * heads * d, 4, generator=gen),
            conv_state=torch.randn(n + 1, 3 * heads * d, 3, generator=gen).to(torch.bfloat16),
            raw_g=torch.randn(n, heads * d, generator=gen),
            A_log=torch.rand(heads, generator=gen),
            dt_bias=torch.randn(heads * d, generator=gen),
            lower_bound=-5.0,
            b=torch.randn(n, heads, generator=gen),
            ssm_state=torch.zeros(n + 1, heads, d, d),
            slots=torch.arange(n),
            norm_weight=torch.ones(d, dtype=torch.bfloat16),
            gate=proj[:, 3 * heads * d :].view(n, heads, d),
        )
        if rank:
            inputs.update(raw_g=factors(0), gate=factors(1))
        return inputs

    for config in configs:
        if not norm:
            fused_kda_decode(**dict(step(), norm_weight=None, gate=None), config=config)
            continue
        fused_kda_decode(**step(), config=config)
        fused_kda_decode(**step(), config=config, quantize=True, quant_dtype=FP8)


def _drive_moe(tokens: int, experts: int, hidden: int, inter: int, topk: int) -> None:
    gen = _gen(tokens + hidden)
    x = torch.randn(tokens, hidden, generator=gen).to(torch.bfloat16)
    w13 = torch.randn(experts, 2 * inter, hidden, generator=gen).to(torch.bfloat16)
    w2 = torch.randn(experts, hidden, inter, generator=gen).to(torch.bfloat16)
    weights, ids = grouped_topk_triton(
        torch.randn(tokens, experts, generator=gen),
        torch.randn(experts, generator=gen),
        RoutingParams(experts, topk),
    )
    for act in (SiluAndMul(), SituAndMul(4.0, 25.0)):  # SiTU: libdevice's tanh for sm_90
        moe_experts_triton(x, w13, w2, weights, ids, act)
        moe_experts_triton_grouped(x, w13, w2, weights, ids, act)
    # The prefill tiles (64-row blocks at 4 stages, 128-row blocks at 8 warps), at these sizes,
    # with pointer loads and through TMA descriptors (the H200's choice).
    for rows in (PREFILL_TILES_ABOVE_ROWS + 1, LARGE_PREFILL_TILES_FROM_ROWS):
        for tma in (False, True):
            tiles = default_tiles(rows, tma=tma)._asdict()
            moe_experts_triton_grouped(x, w13, w2, weights, ids, SiluAndMul(), **tiles)
    # The H200's 128-row tiles take 64-row tail tiles; 16 and 32 rows too.
    for tail in (16, 32):
        tiles = default_tiles(LARGE_PREFILL_TILES_FROM_ROWS, tma=True)._replace(tail_block_m=tail)
        moe_experts_triton_grouped(x, w13, w2, weights, ids, SiluAndMul(), **tiles._asdict())


def _drive_mla(n: int, heads: int, latent: int, rope: int, page: int, capacity: int,
               configs=()) -> None:  # fmt: skip
    """The H200's default launch for these sizes (the CPU's one SM would never split, nor narrow
    the merge kernel's columns), the same merged in the split launch, then `configs`."""
    gen = _gen(n + capacity)
    q = torch.randn(n, heads, latent + rope, generator=gen).to(torch.bfloat16)
    blocks = capacity // page
    cache = torch.randn(n * blocks, page, latent + rope, generator=gen).to(torch.bfloat16)
    tables = torch.arange(n * blocks, dtype=torch.int32).view(n, blocks)
    lens = torch.full((n,), capacity, dtype=torch.int32)
    counters = torch.zeros(DECODE_COUNTERS, dtype=torch.int32)
    default = mla_decode_config(n, heads, latent, capacity, H200_SMS, max_smem=232448)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(mla_decode_module, "num_sms", lambda device=None: H200_SMS)
        for config in (default, replace(default, fused_merge=True), *configs):
            launch_mla_decode(q[..., :latent], q[..., latent:], cache, tables, lens, 0.1, config,
                              counters)  # fmt: skip


def _drive_ops() -> None:
    """Each op at Kimi-Linear's sizes (H200 launch choices where they depend on the device),
    then at the small sizes the CPU tests use."""
    gen = _gen(0)
    for n in (64, 8, 2):  # 64: the state evicted first
        h200 = kda_decode_config(n, 32, 128, H200_SMS)
        _drive_kda_decode(n, 32, 128, [h200, KdaDecodeConfig(128, 8), KdaDecodeConfig(32, 4)])
    # The epilogue's fattest shift programs: 1024-channel tiles, one each and in a loop.
    _drive_kda_decode(2, 32, 128, [KdaDecodeConfig(64, 4, 8), KdaDecodeConfig(64, 4, 1)])
    _drive_kda_decode(2, 32, 128, [KdaDecodeConfig(64, 4, 8)], norm=False)
    _drive_kda_decode(3, 3, 16, [KdaDecodeConfig(4, 2), KdaDecodeConfig(16, 2)])
    # The gate projections in the kernel: R = D = 128 at the H200's launches and in the single
    # kernel, then R = 20 (a masked chunk) small.
    for n in (8, 2, 1):  # 64, 32 and 16-column V blocks
        h200 = kda_decode_config(n, 32, 128, H200_SMS)
        _drive_kda_decode(n, 32, 128, [h200, KdaDecodeConfig(128, 8)], rank=128)
    _drive_kda_decode(3, 3, 16, [KdaDecodeConfig(4, 2), KdaDecodeConfig(16, 2)], rank=20)

    # The router's fp32 gate first (bf16 x, fp32 weight): multiply-and-sum at T = 1, the ieee
    # tl.dot of 64-row blocks, split K, at T = 64, and the defaults that split the weight into
    # three bf16 terms (16-, 32- and 64-row blocks at T = 8, 64 and 300).
    gate = torch.randn(256, 2304, generator=gen)
    gemv_fp32(torch.randn(1, 2304, generator=gen).to(torch.bfloat16), gate)
    x = torch.randn(64, 2304, generator=gen).to(torch.bfloat16)
    gemv_fp32(x, gate, config=GemvConfig(16, 64, split_k=8, use_dot=True, block_m=64))
    for t in (8, 64, 300):
        gemv_fp32(torch.randn(t, 2304, generator=gen).to(torch.bfloat16), gate)
    # o_proj (4096 -> 2304) at M = 64 through tl.dot: FP8 widened to bf16 and FP8 codes into the
    # FP8 MMA (the H200's default, also launched by default below), and in bf16.
    x = torch.randn(64, 4096, generator=gen).to(torch.bfloat16)
    w = torch.randn(2304, 4096, generator=gen)
    a_scale, w_scale = torch.rand(64, 1, generator=gen), torch.rand(2304, 1, generator=gen)
    for fp8_mma in (False, True):
        config = GemvConfig(128, 128, split_k=8, use_dot=True, num_stages=4, fp8_mma=fp8_mma)
        gemv_fp8(x.to(FP8), a_scale, w.to(FP8), w_scale, config=config)
    gemv(x, w.to(torch.bfloat16), config=GemvConfig(64, 128, split_k=4, use_dot=True, num_stages=4))
    gemv_fp8(x.to(FP8), a_scale, w.to(FP8), w_scale)
    # One row, two rows at one full step (2 x 2048 weights), the tl.dot threshold, odd sizes;
    # as the layers launch them (static weights: the first tile before the PDL wait), and not.
    for m, n, k in ((1, 2304, 2304), (2, 2304, 2048), (4, 256, 2304), (3, 40, 96)):
        x = torch.randn(m, k, generator=gen).to(torch.bfloat16)
        for static in (True, False):
            gemv(x, torch.randn(n, k, generator=gen).to(torch.bfloat16), static_weight=static)
        a_scale, w_scale = torch.rand(m, 1, generator=gen), torch.rand(n, 1, generator=gen)
        w = torch.randn(n, k, generator=gen).to(FP8)
        gemv_fp8(x.to(FP8), a_scale, w, w_scale)
        gemv_fp8(x.to(FP8), a_scale, w, w_scale, torch.randn(n, generator=gen), static_weight=True)
    # o_proj (4096 -> 2304) at one row as the layers launch it: its one step of 2 x 4096 codes.
    x = torch.randn(1, 4096, generator=gen).to(FP8)
    w = torch.randn(2304, 4096, generator=gen).to(FP8)
    a_scale, w_scale = torch.rand(1, 1, generator=gen), torch.rand(2304, 1, generator=gen)
    gemv_fp8(x, a_scale, w, w_scale, static_weight=True)
    # One row of a weight of WIDE_TILE_MIN_N channels: the wide tile (KDA's input projection).
    x = torch.randn(1, 2304, generator=gen).to(torch.bfloat16)
    gemv(x, torch.randn(WIDE_TILE_MIN_N, 2304, generator=gen).to(torch.bfloat16))
    # The input norm in that launch (rms_norm_gemv.py), with and without a residual; a K tail.
    w = torch.randn(WIDE_TILE_MIN_N, 2304, generator=gen).to(torch.bfloat16)
    norm_w = torch.ones(2304, dtype=torch.bfloat16)
    for residual in (x, None):
        fused_add_rms_norm_gemv(x, residual, norm_w, 1e-6, w)
    x = torch.randn(1, 300, generator=gen).to(torch.bfloat16)
    fused_add_rms_norm_gemv(
        x, x, torch.ones(300), 1e-6, torch.randn(40, 300, generator=gen).to(torch.bfloat16),
        config=GemvConfig(16, 256, num_warps=1, num_stages=1),
    )  # fmt: skip
    x = torch.randn(2, 64, generator=gen).to(torch.bfloat16)
    for config in (GemvConfig(8, 32, split_k=3), GemvConfig(16, 64, use_dot=True)):
        gemv(x, torch.randn(24, 64, generator=gen).to(torch.bfloat16), config=config)
    # MLA's absorbed W_UK [32, 512, 128] and W_UV [32, 128, 512] at one row, at the H200's
    # configs (batched_config with 132 SMs); a K tail at three rows.
    for n, k, h200 in ((512, 128, GemvConfig(32, 128, num_stages=1)),
                       (128, 512, GemvConfig(8, 512, num_stages=1))):  # fmt: skip
        x = torch.randn(1, 32, k, generator=gen).to(torch.bfloat16).transpose(0, 1)
        w = torch.randn(32, n, k, generator=gen).to(torch.bfloat16)
        gemv_batched(x, w, config=h200, static_weight=True)
    gemv_batched(
        torch.randn(3, 3, 40, generator=gen).to(torch.bfloat16),
        torch.randn(3, 24, 40, generator=gen).to(torch.bfloat16),
    )

    # The fused router at Kimi-Linear's sizes (bf16 x, 256 experts top-8 + 1 shared, sigmoid,
    # bias) at T = 1 and 4 (static weights, as the layers launch it), a swept config (plain),
    # then a small grouped softmax one in fp32.
    kimi = RoutingParams(256, 8, routed_scaling_factor=2.446, num_fused_shared_experts=1)
    small = RoutingParams(24, 4, num_expert_group=4, topk_group=2, renormalize=False,
                          scoring_func="softmax")  # fmt: skip
    semaphore = torch.zeros(1, dtype=torch.int32)
    for t, config in ((1, None), (4, None), (2, FusedRouterConfig(4, 512, 8))):
        x = torch.randn(t, 2304, generator=gen).to(torch.bfloat16)
        fused_router_topk(x, gate, torch.randn(256, generator=gen), kimi, semaphore, config=config,
                          static_weight=config is None)  # fmt: skip
    fused_router_topk(
        torch.randn(3, 40, generator=gen), torch.randn(24, 40, generator=gen), None, small,
        semaphore,
    )  # fmt: skip
    # One key kept (top-1): Triton 3.6's `tl.topk` does not compile at k = 1.
    top1 = RoutingParams(16, 1)
    fused_router_topk(torch.randn(1, 40, generator=gen), torch.randn(16, 40, generator=gen), None,
                      top1, semaphore)  # fmt: skip
    grouped_topk_triton(torch.randn(2, 16, generator=gen), None, top1)
    # The residual add and RMSNorm in the same launch: Kimi-Linear's bf16 rows at T = 1 (the
    # norm's 8 warps), default (static, as the layers launch it) and swept (plain), then small
    # fp32 rows with tail chunks at T = 3.
    norm_weight = torch.ones(2304, dtype=torch.bfloat16)
    for config in (None, FusedRouterConfig(4, 512, 8)):
        x, residual = (torch.randn(1, 2304, generator=gen).to(torch.bfloat16) for _ in range(2))
        fused_norm_router_topk(
            x, residual, norm_weight, 1e-6, gate, torch.randn(256, generator=gen), kimi,
            semaphore, config=config, static_weight=config is None,
        )  # fmt: skip
    fused_norm_router_topk(
        torch.randn(3, 40, generator=gen), torch.randn(3, 40, generator=gen), torch.ones(40),
        1e-6, torch.randn(24, 40, generator=gen), None, small, semaphore,
    )  # fmt: skip

    _drive_moe(4, 64, 2304, 1024, 8)
    _drive_moe(1, 64, 2304, 1024, 8)  # one token: the one-row, one-warp down programs
    _drive_moe(3, 16, 64, 32, 4)
    # The grouping's largest steps: 256 routed + 1 shared expert, 9 slots, decode to prefill
    # (8192 tokens take the chunked kernels, int32 ids there).
    for tokens, block_m in ((64, 16), (4096, 32), (8192, 32)):
        group_rows(torch.randint(0, 257, (tokens, 9), generator=gen), 257, block_m)
    group_rows(torch.randint(0, 257, (8192, 9), generator=gen).int(), 257, 16)
    for tokens, topk, hidden in ((4, 9, 2304), (3, 2, 40)):
        y = torch.randn(tokens * topk, hidden, generator=gen).to(torch.bfloat16)
        weights = torch.rand(tokens, topk, generator=gen)
        inverse = torch.randperm(tokens * topk, generator=gen)
        moe_weighted_sum(y, weights, torch.bfloat16, inverse=inverse)
        moe_weighted_sum(y.float(), weights, torch.float32)

    # The prefill's row gather at Kimi-Linear's size (default launch, then the benchmark's sweep
    # corners), int32 and int64 order, then a small odd one in fp32.
    x = torch.randn(64, 2304, generator=gen).to(torch.bfloat16)
    order = torch.randperm(64 * 9, generator=gen)
    for config in (None, GatherRowsConfig(4, 1024, 4), GatherRowsConfig(32, 256, 8)):
        gather_rows(x, order.to(torch.int32), 9, config=config)
    gather_rows(x, order, 9)
    gather_rows(torch.randn(3, 40, generator=gen), torch.arange(3), 1)

    for rows, inter in ((4, 1024), (3, 40)):
        x = torch.randn(rows, 2 * inter, generator=gen)
        silu_and_mul(x.to(torch.bfloat16))
        silu_and_mul(x)

    # Greedy sampling's argmax: Kimi-Linear's vocabulary in bf16 at 1 and 64 rows (one step a
    # chunk), then chunks of several steps, fp32 and fp16 at small sizes.
    for rows in (1, 64):
        argmax(torch.randn(rows, 163840, generator=gen).to(torch.bfloat16))
    argmax(torch.randn(3, 5000, generator=gen), target_programs=1)
    argmax(torch.randn(2, 40, generator=gen).half())

    for tokens, hidden in ((8, 2304), (3, 48)):
        x = torch.randn(tokens, hidden, generator=gen).to(torch.bfloat16)
        weight = torch.ones(hidden, dtype=torch.bfloat16)
        rms_norm(x, weight, 1e-6)
        fused_add_rms_norm(x, torch.randn(x.shape, generator=gen).to(x.dtype), weight, 1e-6)
        per_token_fp8_quant(x, FP8)
    # MLA's prefill output for o_proj: 32 heads' last 128 of 192 columns, read in place.
    heads = torch.randn(3, 32, 192, generator=gen).to(torch.bfloat16)
    per_token_fp8_quant(heads[..., 64:], FP8)

    for tokens, heads, d in ((8, 32, 128), (5000, 32, 128), (2, 96, 128), (3, 3, 16)):
        x = torch.randn(tokens, heads, d, generator=gen).to(torch.bfloat16)
        gate = torch.randn(x.shape, generator=gen).to(x.dtype)
        rmsnorm_gated_fp8_per_token(x, torch.ones(d), gate, 1e-5, FP8)

    # Kimi-Linear's q | k | v into three tensors (one group per channel block) at the default
    # launch and the benchmark's sweep corners, then a flat `out` and groups split across blocks.
    # Widths 3 and 2 compile other tap sums and carried inputs.
    sweep = [Conv1dPrefillConfig(*c) for c in ((32, 256, 4, 4), (128, 2048, 8, 8))]
    for lens, channels, groups, configs, width in (
        ((7, 300), 3 * 32 * 128, 3, [DEFAULT_PREFILL_CONFIG, *sweep], 4),
        ((3, 1), 40, 1, [None], 4),
        ((3, 5), 48, 3, [Conv1dPrefillConfig(4, 32, 2)], 4),
        ((3, 5), 48, 1, [None], 3),
        ((3, 5), 48, 1, [None], 2),
    ):
        tokens = sum(lens)
        qsl = torch.tensor([0, *lens]).cumsum(0)
        x = torch.randn(tokens, channels + 288, generator=gen).to(torch.bfloat16)[:, :channels]
        out = torch.empty(groups, tokens, channels // groups, dtype=torch.bfloat16)
        for config in configs:
            causal_conv1d_prefill(
                x, torch.randn(channels, width, generator=gen),
                torch.randn(3, channels, width - 1, generator=gen).to(torch.bfloat16),
                qsl, torch.tensor([2, 0]), torch.tensor([True, False]),
                out=out if groups > 1 else None, config=config,
            )  # fmt: skip

    # Kimi-Linear's latent write: bf16 kv_a sliced from the merged q | kv_a projection (32 heads
    # x 192, then 576), int64 slots; then fp32 into a bf16 cache, int32 slots, small odd widths.
    proj = torch.randn(3, 32 * 192 + 576, generator=gen).to(torch.bfloat16)
    cache = torch.empty(4, 16, 576, dtype=torch.bfloat16)
    weight = torch.ones(512, dtype=torch.bfloat16)
    mla_cache_write(proj[:, 32 * 192 :], weight, 1e-6, cache, torch.tensor([5, 0, 63]))
    kv_a = torch.randn(2, 40, generator=gen)
    slots = torch.tensor([3, -1], dtype=torch.int32)
    mla_cache_write(kv_a, torch.ones(33), 1e-6, cache[:, :, :40], slots)

    # MLA prefill's key: Kimi-Linear's k_nope in kv_b_proj's output (32 heads x (128 + 128)) and
    # k_pe after the latent in cache rows; then fp32 and dims off powers of two.
    kv = torch.randn(5, 32, 256, generator=gen).to(torch.bfloat16)
    mla_prefill_key(kv[..., :128], torch.randn(5, 576, generator=gen).to(torch.bfloat16)[:, 512:])
    k_nope = torch.randn(3, 3, 40, generator=gen)[..., :24]
    mla_prefill_key(k_nope, torch.randn(3, 12, generator=gen))
    # The same launch making a new prompt's q (a column slice of the fused projection) and v
    # contiguous as well, for cuDNN's per-length-class plans.
    q = torch.randn(5, 32 * 192 + 576, generator=gen).to(torch.bfloat16)[:, : 32 * 192]
    mla_prefill_dense_operands(q.view(5, 32, 192), kv[..., :128], kv[:, 0, 192:], kv[..., 128:])
    # Kimi-K3's q (q_b_proj's contiguous output): v alone copied.
    q = torch.randn(5, 32, 192, generator=gen).to(torch.bfloat16)
    mla_prefill_dense_operands(q, kv[..., :128], kv[:, 0, 192:], kv[..., 128:])

    # Kimi-Linear's sizes; then the benchmark's h16 tiles merged in the split launch, and both
    # wide tiles with the latent in 2 and 4 chunks, merged both ways and with one split; two
    # splits merged in a second launch, 66 (the most the merge unrolls) and 128 (the default for
    # 16 local heads at batch 1 and a long capacity: the merge's loop past the unrolled ones).
    chunked = [
        MlaDecodeConfig(8, 16, 64, 8, 5, fused_merge=True),
        MlaDecodeConfig(8, 32, 64, 8, 5, latent_chunks=2),
        MlaDecodeConfig(8, 32, 64, 8, 5, fused_merge=True, latent_chunks=4),
        MlaDecodeConfig(8, 16, 64, 8, 5, fused_merge=True, latent_chunks=2),
        MlaDecodeConfig(8, 16, 64, 8, 5, latent_chunks=4),
        MlaDecodeConfig(2, 32, 64, 8, 5),
        MlaDecodeConfig(66, 16, 64, 8, 5),
        MlaDecodeConfig(128, 16, 64, 8, 5),
    ]
    _drive_mla(2, 32, 512, 64, 64, 4096, chunked)
    one_split = [
        MlaDecodeConfig(1, 16, 64, 8, 5, latent_chunks=4),
        MlaDecodeConfig(1, 32, 64, 8, 5, latent_chunks=2),
    ]
    _drive_mla(1, 32, 512, 64, 16, 64, one_split)


def _record(mp: pytest.MonkeyPatch, launches: list[dict], pdl: bool) -> None:
    """Swap every kernel for a recorder appending to `launches`; with `pdl`, `use_pdl` holds (as
    on the H200) in every kernel's module."""
    for module_name, names in KERNELS.items():
        module = importlib.import_module(module_name)
        for name in names:
            recorder = _RecordedKernel(module_name, name, getattr(module, name), launches)
            mp.setattr(module, name, recorder)
        if pdl and hasattr(module, "use_pdl"):
            mp.setattr(module, "use_pdl", lambda device: True)


@functools.cache
def _launches() -> tuple[dict, ...]:
    """The recorded launches of every kernel (the ops driven once per session), with
    programmatic dependent launch as on the H200, then a few without."""
    launches: list[dict] = []
    with pytest.MonkeyPatch.context() as mp:
        _record(mp, launches, pdl=True)
        _drive_ops()
    with pytest.MonkeyPatch.context() as mp:
        _record(mp, launches, pdl=False)
        # The epilogue norming a token's heads in chunks (Kimi-Linear's 32 x 128 is one tile).
        mp.setattr(kda_decode_module, "_EPILOGUE_TILE", 32)
        _drive_kda_decode(3, 3, 16, [KdaDecodeConfig(4, 2)])
        x = torch.randn(3, 48, generator=_gen(1)).to(torch.bfloat16)
        rms_norm(x, torch.ones(48, dtype=torch.bfloat16), 1e-6)
        gemv(x, torch.randn(40, 48, generator=_gen(2)).to(torch.bfloat16))
    return tuple(dict(launch, **_ptx_checks(launch)) for launch in launches)


def _in_compiler(launches, *flags: str) -> list:
    """sm90_compile.py's results for `launches`, in one child process without the interpreter."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    root = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = os.pathsep.join(filter(None, (root, env.get("PYTHONPATH"))))
    result = subprocess.run(
        [sys.executable, str(Path(__file__).with_name("sm90_compile.py")), *flags],
        input=json.dumps(launches), capture_output=True, text=True, env=env, check=False,
    )  # fmt: skip
    if result.returncode != 0:
        raise RuntimeError(f"the compiling process failed:\n{result.stderr}")
    return json.loads(result.stdout)


@functools.cache
def _compile_errors() -> tuple[str | None, ...]:
    """Compiles every recorded launch."""
    return tuple(_in_compiler(_launches()))


def test_every_kernel_is_listed():
    """A new `@triton.jit def ..._kernel` under vllm/ (with or without the decorator's arguments)
    joins KERNELS (or the conftest registry)."""
    root = Path(__file__).resolve().parents[2] / "vllm"
    jit_kernel = re.compile(r"@triton\.jit(?:\([^)]*\))?\s*\n\s*def (\w+_kernel)\(")
    found = {k for path in root.rglob("*.py") for k in jit_kernel.findall(path.read_text())}
    listed = {k for names in KERNELS.values() for k in names}
    assert found == listed


def test_every_kernel_launches_with_pdl_where_it_runs():
    """Where `use_pdl` holds, every kernel's launches pass the PDL constexpr and the `launch_pdl`
    option together (a launch with the option but without the wait would let the kernel read
    its inputs before they are written); where it does not, neither."""
    launches = _launches()
    for kernel in (k for names in KERNELS.values() for k in names):
        seen = {
            (launch["args"]["PDL"], launch["options"].get("launch_pdl", False))
            for launch in launches
            if launch["kernel"] == kernel
        }
        assert (True, True) in seen, kernel
        assert seen <= {(True, True), (False, False)}, (kernel, seen)
    assert any(not launch["args"]["PDL"] for launch in launches)


def test_the_decode_launches_reach_the_load_order_check():
    """The recorded launches include each decode-size path that `_loads_before_barrier` checks
    (so a path no op takes any more cannot leave its check vacuous): the one-token router with
    and without the norm, the one-token gate/up, the one-step GEMV at one and two rows, the
    RMSNorm over several warps, the cache write, the KDA decode at batch 1, MLA's absorbed
    products."""
    checked = [launch for launch in _launches() if "loads_before_barrier" in launch]

    def has(kernel, **args):
        return any(
            launch["kernel"] == kernel and all(launch["args"][k] == v for k, v in args.items())
            for launch in checked
        )

    for norm in (False, True):
        assert has("_fused_router_topk_kernel", HAS_NORM=norm, BLOCK_T=1, PRELOAD=True)
    assert has("_fused_router_topk_kernel", BLOCK_T=1, WHOLE_ROW=True, PRELOAD=False)
    assert has("_moe_gate_up_kernel", HIDDEN=2304)
    for preload in (True, False):
        assert has("_gemv_kernel", BLOCK_M=1, BLOCK_K=4096, PRELOAD=preload)
        assert has("_gemv_kernel", BLOCK_M=2, PRELOAD=preload)
    # MLA's W_UK and W_UV at batch 1, as the layer launches them.
    assert has("_gemv_kernel", BATCHED=True, BLOCK_M=1, BLOCK_K=128, PRELOAD=True)
    assert has("_gemv_kernel", BATCHED=True, BLOCK_M=1, BLOCK_K=512, PRELOAD=True)
    assert has("_rms_norm_kernel") and has("_mla_cache_write_kernel")
    assert has("_fused_kda_decode_kernel", RANK_F=128, BLOCK_V=16)  # the engine's batch 1


def test_mla_prefill_operands_kernel_compiles_in_the_models_forms():
    """The MLA prefill's operands kernel is compiled for the key alone, for a new prompt's q, k
    and v together (Kimi-Linear's strided q; the form cuDNN's per-length-class plans take) and
    with v alone copied (Kimi-K3's contiguous q). The fourth form, q alone copied, is a subset of
    the second's code that neither model launches; the interpreter runs it."""
    forms = {
        (launch["args"]["COPY_Q"], launch["args"]["COPY_V"])
        for launch in _launches()
        if launch["kernel"] == "_mla_prefill_operands_kernel"
    }
    assert forms == {(False, False), (True, True), (False, True)}


@pytest.mark.skipif(not _has_nvidia_backend(), reason="needs Triton's NVIDIA backend and ptxas")
@pytest.mark.parametrize("block_v", [16, 32, 64])  # the engine's V-split at batch 1, 2, 4-16
def test_kda_decode_state_sums_keep_their_layout_with_gate_projections(block_v):
    """The V-split's state tile reductions (`[D, block_v]`) have the same sm_90 layout, hence
    the same summation order, with the gate projections in the kernel as without, at ranks
    below, at and above block_v and at Kimi-Linear's 128 (`gate_proj_tiling`: a projection
    tile shaped like the state tile would lend it its layout). Checked in the TTGIR."""
    base = next(
        launch for launch in _launches()
        if launch["kernel"] == "_fused_kda_decode_kernel" and launch["args"]["RANK_F"] == 128
        and launch["args"]["BLOCK_V"] == block_v and launch["args"]["D"] == 128
    )  # fmt: skip
    variants = []
    for rank in (0, block_v // 2, block_v, 2 * block_v, 128):
        block_r, whole = gate_proj_tiling(rank, 128, block_v)
        args = dict(base["args"], RANK_F=rank, RANK_G=rank, BLOCK_R=block_r, WHOLE_RANK=whole)
        variants.append(dict(base, args=args, reduce_shape=f"128x{block_v}"))
    layouts = _in_compiler(variants, "--reduce-layouts")
    assert layouts[0] and all(found == layouts[0] for found in layouts[1:]), layouts


@pytest.mark.skipif(not _has_nvidia_backend(), reason="needs Triton's NVIDIA backend and ptxas")
@pytest.mark.parametrize("residual", [True, False])
def test_norm_gemv_sums_are_laid_out_as_the_unfused_kernels(residual):
    """The fused input norm's two reductions at Kimi-Linear's KDA projection have the sm_90
    layouts, hence the summation orders, of the kernels it replaces: the row's sum of squares
    `_rms_norm_kernel`'s, the weight tile's sums `_gemv_kernel`'s in `WIDE_TILE`
    (rms_norm_gemv.py's bit-for-bit claim, checked on the GPU by its tests). Checked in the
    TTGIR."""

    def recorded(kernel: str, **args) -> dict:
        return next(
            launch for launch in _launches()
            if launch["kernel"] == kernel and launch["options"]["num_warps"] == 8
            and all(launch["args"][name] == value for name, value in args.items())
        )  # fmt: skip

    fused = recorded("_rms_norm_gemv_kernel", BLOCK_D=4096, HAS_RESIDUAL=residual)
    norm = recorded("_rms_norm_kernel", BLOCK=4096, HAS_RESIDUAL=residual)
    gemv = recorded("_gemv_kernel", BLOCK_M=1, BLOCK_N=16, BLOCK_K=256, USE_DOT=False)
    fused_row, norm_row, fused_tiles, gemv_tiles = _in_compiler(
        [dict(fused, reduce_shape="4096"), dict(norm, reduce_shape="4096"),
         dict(fused, reduce_shape="16x256"), dict(gemv, reduce_shape="16x256")],
        "--reduce-layouts",
    )  # fmt: skip
    assert len(fused_row) == len(norm_row) == 1 and fused_row == norm_row
    assert fused_tiles and gemv_tiles and set(fused_tiles) == set(gemv_tiles), (
        fused_tiles,
        gemv_tiles,
    )


def test_norm_gemv_caps_registers_in_the_wide_tile_only():
    """The fused norm's launch at Kimi-Linear's projection (`WIDE_TILE`) asks for at most
    `MAX_REGISTERS` registers (one wave of programs, measured); other tiles are not capped."""
    caps = {
        (launch["args"]["BLOCK_D"], launch["args"]["HAS_RESIDUAL"], launch["args"]["PDL"]):
            launch["options"].get("maxnreg")
        for launch in _launches()
        if launch["kernel"] == "_rms_norm_gemv_kernel"
    }  # fmt: skip
    assert caps == {
        (4096, True, True): MAX_REGISTERS, (4096, False, True): MAX_REGISTERS,
        (512, True, True): None,
    }, caps  # fmt: skip


def test_the_engine_launch_at_64_sequences_evicts_the_kda_state_first():
    """The H200's default launch at batch 64 reaches the kernel with the policy (whose PTX
    `_ptx_checks` then asks for), and the other recorded launches without it."""
    policies = {
        launch["args"]["EVICT"]
        for launch in _launches()
        if launch["kernel"] == "_fused_kda_decode_kernel"
    }
    assert policies == {"evict_first", ""}


@pytest.mark.skipif(not _has_nvidia_backend(), reason="needs Triton's NVIDIA backend and ptxas")
@pytest.mark.parametrize("kernel", [k for names in KERNELS.values() for k in names])
def test_kernel_compiles_for_sm90(kernel):
    recorded = [
        (launch, error)
        for launch, error in zip(_launches(), _compile_errors(), strict=True)
        if launch["kernel"] == kernel
    ]
    assert recorded, f"no op launched {kernel}: drive it in _drive_ops"
    failures = [
        f"{kernel} with {launch['options']} and "
        f"{ {k: v for k, v in launch['args'].items() if not isinstance(v, dict)} }:\n{error}"
        for launch, error in recorded
        if error is not None
    ]
    if failures:
        pytest.fail("\n\n".join(failures), pytrace=False)
