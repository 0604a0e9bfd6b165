"""FusedMoE's expert implementations: each against an fp64 per-(token, slot) reference and against
the loop, their static-shape (sync-free) property, the path selection, and CUDA-graph capture.
The Triton paths (GEMV and expert-grouped) run under the interpreter on CPU (tests/conftest.py)
and natively on a GPU."""

from dataclasses import replace

import pytest
import torch
from counted_kernels import record_launches
from launch_keys import KeyRecorder, native_specialize_impl

import vllm.model_executor.layers.fused_moe.experts as experts_mod
import vllm.model_executor.layers.fused_moe.experts_triton_grouped as experts_triton_grouped
import vllm.model_executor.layers.fused_moe.group_rows as group_rows_module
import vllm.model_executor.layers.fused_moe.weighted_sum as weighted_sum_module
import vllm.triton_utils.launch as launch_module
from vllm.config.vllm import decode_batch_class
from vllm.model_executor.layers.activation import SiluAndMul, SituAndMul
from vllm.model_executor.layers.fused_moe.experts import (
    GATHER_MAX_ROWS,
    TRITON_GROUPED_MAX_ROWS,
    TRITON_GROUPED_MAX_ROWS_ELSEWHERE,
    TRITON_MAX_ROWS,
    grouped_mm_is_sync_free,
    moe_experts_gathered,
    moe_experts_grouped,
    moe_experts_loop,
    select_experts_impl,
)
from vllm.model_executor.layers.fused_moe.experts_triton import moe_experts_triton
from vllm.model_executor.layers.fused_moe.experts_triton_grouped import (
    LARGE_PREFILL_TILES_FROM_ROWS,
    PREFILL_TILES_ABOVE_ROWS,
    moe_experts_triton_grouped,
)
from vllm.model_executor.layers.fused_moe.group_rows import (
    group_rows,
    group_rows_chunked,
    group_rows_reference,
    max_blocks_for,
)
from vllm.model_executor.layers.fused_moe.layer import FusedMoE
from vllm.model_executor.layers.fused_moe.router import (
    RoutingParams,
    grouped_topk,
    grouped_topk_ref,
    grouped_topk_triton,
)
from vllm.model_executor.layers.fused_moe.weighted_sum import moe_weighted_sum_ref
from vllm.model_executor.layers.ops.silu_and_mul import silu_and_mul_ref
from vllm.platforms.cpu import CpuPlatform
from vllm.platforms.cuda import CudaPlatform
from vllm.triton_utils import supports_tma

E, H, INTER, K = 16, 64, 32, 4
SYNC_FREE = [moe_experts_gathered, moe_experts_grouped]
# Where the Triton path runs: natively on a GPU, under the interpreter on CPU (tests/conftest.py).
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def make_case(tokens, dtype, device="cpu", seed=0, experts=E, hidden=H, inter=INTER, topk=K):
    gen = torch.Generator().manual_seed(seed)
    # Scaled so every GEMM output is O(1): errors are then comparable to the dtype's epsilon.
    w13 = torch.randn(experts, 2 * inter, hidden, generator=gen) / hidden**0.5
    w2 = torch.randn(experts, hidden, inter, generator=gen) / inter**0.5
    x = torch.randn(tokens, hidden, generator=gen)
    ids = torch.rand(tokens, experts, generator=gen).topk(topk, dim=1)[1]
    weights = torch.rand(tokens, topk, generator=gen)
    on = dict(device=device)
    return (x.to(dtype=dtype, **on), w13.to(dtype=dtype, **on), w2.to(dtype=dtype, **on),
            weights.to(**on), ids.to(**on))  # fmt: skip


def reference_fp64(x, w13, w2, weights, ids, act):
    """Sum over (token, slot) of weight * w2[e] @ act(w13[e] @ x[t]), in fp64, one row at a time."""
    out = torch.zeros(x.shape, dtype=torch.float64)
    for t in range(x.shape[0]):
        for j in range(ids.shape[1]):
            e = int(ids[t, j])
            h = act(w13[e].double().cpu() @ x[t].double().cpu())
            out[t] += float(weights[t, j]) * (w2[e].double().cpu() @ h)
    return out


@pytest.mark.parametrize("tokens", [1, 5, 37])
@pytest.mark.parametrize("impl", [moe_experts_loop, *SYNC_FREE])
def test_fp32_matches_fp64_reference(impl, tokens):
    x, w13, w2, w, ids = make_case(tokens, torch.float32)
    out = impl(x, w13, w2, w, ids, SiluAndMul())
    # fp32 defaults (rtol 1.3e-6, atol 1e-5): two length-<=64 fp32 dot products of O(1) terms
    # and a K=4 sum accumulate ~64 * 6e-8 absolute error, well inside atol.
    torch.testing.assert_close(out.double(), reference_fp64(x, w13, w2, w, ids, SiluAndMul()),
                               rtol=1.3e-6, atol=1e-5)  # fmt: skip


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("tokens", [0, 1, 8, 37])
@pytest.mark.parametrize("impl", SYNC_FREE)
def test_matches_loop(impl, tokens, dtype):
    x, w13, w2, w, ids = make_case(tokens, dtype, seed=tokens)
    act = SituAndMul(4.0, 25.0)
    expected = moe_experts_loop(x, w13, w2, w, ids, act)
    out = impl(x, w13, w2, w, ids, act)
    assert out.dtype == dtype and out.shape == x.shape
    # Same rounding points as the loop (GEMM outputs and the activation in `dtype`, fp32 sum), so
    # only the GEMMs' accumulation order may differ: torch's defaults for the dtype (fp32: rtol
    # 1.3e-6 / atol 1e-5; bf16: rtol 1.6e-2 = 2 ulps of bf16 / atol 1e-5).
    torch.testing.assert_close(out, expected)


def test_grouped_gathers_rows_in_one_launch(triton_launches):
    """Where Triton runs, the grouped path's row gather is `gather_rows` (one launch)."""
    x, w13, w2, w, ids = make_case(8, torch.bfloat16, seed=3)
    out = moe_experts_grouped(x, w13, w2, w, ids, SiluAndMul())
    assert triton_launches["_gather_rows_kernel"] == 1
    torch.testing.assert_close(out, moe_experts_loop(x, w13, w2, w, ids, SiluAndMul()))


def test_bf16_loop_is_within_bf16_rounding_of_fp64():
    x, w13, w2, w, ids = make_case(37, torch.bfloat16)
    act = SiluAndMul()
    expected = reference_fp64(x, w13, w2, w, ids, act)
    out = moe_experts_loop(x, w13, w2, w, ids, act).double()
    # Three bf16 roundings (h, act, y) of ~2^-9 relative each plus the final cast: a few bf16
    # ulps of the output scale.
    scale = expected.abs().max()
    assert (out - expected).abs().max() <= 4 * 2**-8 * scale


def test_repeated_expert_in_a_token_counts_twice():
    x, w13, w2, w, _ = make_case(3, torch.float32)
    ids = torch.tensor([[2, 2, 5, 5], [0, 1, 2, 3], [7, 7, 7, 7]])
    for impl in SYNC_FREE:
        torch.testing.assert_close(
            impl(x, w13, w2, w, ids, SiluAndMul()),
            moe_experts_loop(x, w13, w2, w, ids, SiluAndMul()),
        )


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_sync_free_paths_run_without_tensor_values(dtype):
    """On the meta device no value exists: a path that reads one on the host (a sync on a GPU) or
    makes a shape depend on one fails here. The loop is the control that must fail."""
    x, w13, w2, w, ids = make_case(6, dtype)
    meta = [t.to("meta") for t in (x, w13, w2, w, ids)]
    impls = [moe_experts_gathered] + ([moe_experts_grouped] if dtype == torch.bfloat16 else [])
    for impl in impls:
        out = impl(*meta, SituAndMul(4.0, 25.0))
        assert out.device.type == "meta" and out.shape == x.shape and out.dtype == dtype
    with pytest.raises(NotImplementedError):
        moe_experts_loop(*meta, SiluAndMul())


def test_bad_shapes_name_the_argument():
    x, w13, w2, w, ids = make_case(3, torch.float32)
    act = SiluAndMul()
    with pytest.raises(ValueError, match="w13 must be"):
        moe_experts_gathered(x, w13[:, :, :-1], w2, w, ids, act)
    with pytest.raises(ValueError, match="w2 must be"):
        moe_experts_grouped(x, w13, w2[:, :, :-1], w, ids, act)
    with pytest.raises(ValueError, match="topk_ids must be"):
        moe_experts_loop(x, w13, w2, w, ids[:2], act)
    with pytest.raises(ValueError, match="topk_weights shape"):
        moe_experts_gathered(x, w13, w2, w[:, :2], ids, act)


def _cuda_platform(capability):
    platform = CudaPlatform()
    platform.__dict__["device_capability"] = capability  # the cached_property's slot
    return platform


class UnfusedSilu(SiluAndMul):
    """A subclass may change `forward`: the kernels fuse exact types only."""


SILU, SITU, UNFUSED = SiluAndMul(), SituAndMul(4.0, 25.0), UnfusedSilu()


@pytest.mark.parametrize(
    "capability,dtype,rows,hidden,act,expected",
    [
        ((9, 0), torch.bfloat16, 1, 2304, SILU, moe_experts_triton),
        ((9, 0), torch.bfloat16, TRITON_MAX_ROWS, 2304, SILU, moe_experts_triton),
        ((9, 0), torch.bfloat16, TRITON_MAX_ROWS + 1, 2304, SILU, moe_experts_triton_grouped),
        ((9, 0), torch.bfloat16, TRITON_GROUPED_MAX_ROWS, 2304, SILU, moe_experts_triton_grouped),
        ((9, 0), torch.bfloat16, TRITON_GROUPED_MAX_ROWS + 1, 2304, SILU, moe_experts_grouped),
        # Prefill sizes take the grouped Triton path only where they were measured (Hopper-class).
        (
            (8, 0),
            torch.bfloat16,
            TRITON_GROUPED_MAX_ROWS_ELSEWHERE,
            2304,
            SILU,
            moe_experts_triton_grouped,
        ),
        (
            (8, 0),
            torch.bfloat16,
            TRITON_GROUPED_MAX_ROWS_ELSEWHERE + 1,
            2304,
            SILU,
            moe_experts_loop,
        ),
        (
            (9, 0),
            torch.float32,
            TRITON_GROUPED_MAX_ROWS_ELSEWHERE + 1,
            2304,
            SILU,
            moe_experts_loop,
        ),
        ((9, 0), torch.bfloat16, 8, 2304, SITU, moe_experts_triton),  # SiTU is fused too
        ((9, 0), torch.bfloat16, 512, 2304, SITU, moe_experts_triton_grouped),
        ((9, 0), torch.bfloat16, 8, 2304, UNFUSED, moe_experts_grouped),
        ((9, 0), torch.bfloat16, 512, 2304, UNFUSED, moe_experts_grouped),
        ((10, 0), torch.bfloat16, TRITON_GROUPED_MAX_ROWS + 1, 2304, SILU, moe_experts_grouped),
        ((9, 0), torch.bfloat16, 8, 2300, UNFUSED, moe_experts_gathered),  # rows not aligned
        ((9, 0), torch.bfloat16, 8, 2300, SILU, moe_experts_triton),  # any alignment
        ((9, 0), torch.bfloat16, 512, 2300, SILU, moe_experts_triton_grouped),
        ((9, 0), torch.float32, 8, 2304, SILU, moe_experts_triton),
        ((9, 0), torch.float32, GATHER_MAX_ROWS, 2304, UNFUSED, moe_experts_gathered),
        ((9, 0), torch.float32, TRITON_MAX_ROWS + 1, 2304, SILU, moe_experts_triton_grouped),
        ((9, 0), torch.float32, TRITON_GROUPED_MAX_ROWS + 1, 2304, SILU, moe_experts_loop),
        ((8, 0), torch.bfloat16, 8, 2304, UNFUSED, moe_experts_gathered),  # torch's syncs
        ((8, 0), torch.bfloat16, 8, 2304, SILU, moe_experts_triton),
        ((8, 0), torch.bfloat16, 512, 2304, SILU, moe_experts_triton_grouped),
        ((12, 0), torch.bfloat16, 8, 2304, UNFUSED, moe_experts_gathered),
        ((12, 0), torch.bfloat16, 8, 2304, SITU, moe_experts_triton),
    ],
)
def test_selection_on_cuda(monkeypatch, capability, dtype, rows, hidden, act, expected):
    monkeypatch.setattr(experts_mod, "current_platform", _cuda_platform(capability))
    impl = select_experts_impl(torch.device("cuda"), dtype, rows, hidden, 1024, act)
    assert impl is expected


def test_selection_on_cpu(monkeypatch):
    monkeypatch.setattr(experts_mod, "current_platform", CpuPlatform())
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    cpu = torch.device("cpu")
    assert not grouped_mm_is_sync_free(cpu, torch.bfloat16)
    assert select_experts_impl(cpu, torch.bfloat16, 8, H, INTER, SILU) is moe_experts_gathered
    large = GATHER_MAX_ROWS + 1
    assert select_experts_impl(cpu, torch.bfloat16, large, H, INTER, SILU) is moe_experts_loop


def test_selection_on_cpu_under_the_triton_interpreter(monkeypatch):
    monkeypatch.setattr(experts_mod, "current_platform", CpuPlatform())
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    cpu = torch.device("cpu")
    rows = TRITON_MAX_ROWS
    assert select_experts_impl(cpu, torch.float32, rows, H, INTER, SILU) is moe_experts_triton
    gather = GATHER_MAX_ROWS
    assert (
        select_experts_impl(cpu, torch.float32, gather, H, INTER, UNFUSED) is moe_experts_gathered
    )
    assert select_experts_impl(cpu, torch.float32, rows, H, INTER, SITU) is moe_experts_triton
    grouped = select_experts_impl(cpu, torch.float32, rows + 1, H, INTER, SILU)
    assert grouped is moe_experts_triton_grouped
    above = TRITON_GROUPED_MAX_ROWS + 1
    assert select_experts_impl(cpu, torch.float32, above, H, INTER, SILU) is moe_experts_loop


def _fused_moe(dtype, device, seed=0):
    x, w13, w2, w, ids = make_case(1, dtype, seed=seed)
    layer = FusedMoE(E, H, INTER, SiluAndMul(), params_dtype=dtype)
    layer.w13_weight.data.copy_(w13)
    layer.w2_weight.data.copy_(w2)
    return layer.to(device)


# The Triton GEMV path, then the grouped Triton path (fp32 rows above TRITON_MAX_ROWS).
@pytest.mark.parametrize("tokens", [2, TRITON_MAX_ROWS // K + 3])
def test_fused_moe_forward_matches_loop(tokens, triton_launches):
    layer = _fused_moe(torch.float32, DEVICE)
    x, _, _, w, ids = make_case(tokens, torch.float32, device=DEVICE, seed=1)
    expected = moe_experts_loop(x, layer.w13_weight, layer.w2_weight, w, ids, SiluAndMul())
    torch.testing.assert_close(layer(x, w, ids), expected)
    gemv = tokens * K <= TRITON_MAX_ROWS
    assert triton_launches["_moe_down_kernel"] == int(gemv)
    assert triton_launches["_moe_grouped_down_kernel"] == int(not gemv)


def _graph_replay_equals_eager(dtype, tokens):
    layer = _fused_moe(dtype, "cuda")
    x, _, _, w, ids = make_case(tokens, dtype, device="cuda", seed=2)
    # Captured on other values, so the replay must read the inputs copied in afterwards.
    other = make_case(tokens, dtype, device="cuda", seed=3)
    static = [other[0], other[3], other[4]]
    layer(x, w, ids)  # first call: lazy library init is not what a decode step pays
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        eager = layer(x, w, ids)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        layer(*static)  # warm-up outside the graph (workspace allocations, lazy init)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = layer(*static)
    for buf, new in zip(static, (x, w, ids), strict=True):
        buf.copy_(new)
    captured.zero_()
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(captured, eager)
    reference = moe_experts_loop(x, layer.w13_weight, layer.w2_weight, w, ids, SiluAndMul())
    return eager, reference


@pytest.mark.gpu
@pytest.mark.parametrize("tokens", [1, 8, 64])
def test_cuda_graph_fp32(tokens):
    # Triton GEMV up to TRITON_MAX_ROWS rows (TRITON_MAX_ROWS // K tokens), grouped Triton above
    # (IEEE fp32 dots): the only difference from the loop is GEMM accumulation order (cuBLAS,
    # TF32 off).
    eager, reference = _graph_replay_equals_eager(torch.float32, tokens)
    torch.testing.assert_close(eager, reference)


@pytest.mark.gpu
@pytest.mark.parametrize("tokens", [1, 8, 64])
def test_cuda_graph_bf16(tokens):
    if tokens * K > TRITON_GROUPED_MAX_ROWS and not grouped_mm_is_sync_free(
        torch.device("cuda"), torch.bfloat16
    ):
        pytest.skip("no sync-free path for this batch on this GPU (torch's grouped GEMM: sm90/100)")
    eager, loop = _graph_replay_equals_eager(torch.bfloat16, tokens)
    layer = _fused_moe(torch.bfloat16, "cpu")
    x, _, _, w, ids = make_case(tokens, torch.bfloat16, seed=2)
    expected = reference_fp64(x, layer.w13_weight, layer.w2_weight, w, ids, SiluAndMul())
    # The CUTLASS grouped GEMM and cuBLAS accumulate in different orders, so they need not agree
    # bit for bit; both must be within the bf16 rounding bound that the loop meets on CPU.
    bound = 4 * 2**-8 * expected.abs().max()
    assert (loop.double().cpu() - expected).abs().max() <= bound
    assert (eager.double().cpu() - expected).abs().max() <= bound


SMALL_BLOCKS = dict(block_n=8, block_k=16, gate_up_warps=2, block_h=16, block_i=8, down_warps=2)
# For the tests of something other than the tiling (ids, strides, slots, fp64 parity): 2 programs
# per routed row and per token at I 32 / H 64, where the defaults launch 4 and 64 (the
# interpreter pays per program). Only block_k / block_i cut a sum into chunks, so the
# interpreter's outputs are the defaults' bit for bit; test_triton_matches_loop runs the defaults
# themselves.
WIDE_BLOCKS = dict(block_n=16, block_h=32)


@pytest.mark.parametrize("hidden,block_k", [(H, 256), (2304, 256), (3584, 512), (1024, 512)])
def test_triton_default_launch(hidden, block_k, monkeypatch):
    # The defaults at every token count (docs/performance.md, forty-sixth run): one hidden output
    # and one warp per down program, the gate/up kernel's steps over H unrolled, 512 wide where
    # 512 divides H (Kimi-K3's 3584 at TP 8), else 256 (Kimi-Linear's 2304).
    import vllm.model_executor.layers.fused_moe.experts_triton as experts_triton

    launches = []

    class Recorder:
        def __init__(self, name):
            self.name = name

        def __getitem__(self, grid):
            def run(*args, **kwargs):
                blocks = tuple(kwargs.get(k) for k in ("BLOCK_H", "BLOCK_K", "HIDDEN"))
                launches.append((self.name, grid, blocks, kwargs["num_warps"]))

            return run

    for name in ("_moe_gate_up_kernel", "_moe_down_kernel"):
        monkeypatch.setattr(experts_triton, name, Recorder(name))
    for tokens in (1, 2, 5):
        moe_experts_triton(*make_case(tokens, torch.float32, hidden=hidden), SiluAndMul())
    down = [launch[1:] for launch in launches if launch[0] == "_moe_down_kernel"]
    assert down == [((tokens, hidden), (1, None, None), 1) for tokens in (1, 2, 5)]
    gate_up = [launch[1:] for launch in launches if launch[0] == "_moe_gate_up_kernel"]
    assert gate_up == [
        ((tokens * K, INTER // 8), (None, block_k, hidden), 4) for tokens in (1, 2, 5)
    ]


@pytest.mark.parametrize("tokens,experts,warps", [(1, 256, 4), (256, 256, 4), (257, 256, 1),
                                                  (1, 64, 1)])  # fmt: skip
def test_topk_warps_by_tokens(tokens, experts, warps, monkeypatch):
    # The H200 defaults (docs/performance.md, seventh and eighth runs): 4 warps a token at 256
    # experts up to 256 tokens, one warp for a prefill's thousands of programs and few experts.
    import vllm.model_executor.layers.fused_moe.router as router

    seen = []

    class Recorder:
        def __getitem__(self, grid):
            return lambda *args, **kwargs: seen.append(kwargs["num_warps"])

    monkeypatch.setattr(router, "_grouped_topk_kernel", Recorder())
    logits = torch.randn(tokens, experts, generator=torch.Generator().manual_seed(tokens))
    grouped_topk_triton(logits.to(DEVICE), None, RoutingParams(experts, 8))
    assert seen == [warps]


def assert_close_to_loop(out, expected):
    """fp32: torch's defaults. bf16: rtol 2 bf16 ulps, atol 1 ulp of the output scale. Same
    rounding points as the loop, but where the accumulation order flips a GEMM output by one
    ulp, an output entry near zero moves by about one ulp of the output scale."""
    scale = expected.abs().amax().item() if expected.numel() else 0.0
    atol = 1e-5 if out.dtype == torch.float32 else max(2**-8 * scale, 1e-5)
    rtol = 1.3e-6 if out.dtype == torch.float32 else 1.6e-2
    torch.testing.assert_close(out, expected, rtol=rtol, atol=atol)


@pytest.mark.parametrize("blocks", [{}, SMALL_BLOCKS], ids=["default", "small"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize(
    "tokens,experts,topk,hidden,inter",
    [
        (1, 16, 4, 64, 32),
        (13, 16, 4, 64, 32),
        (5, 8, 3, 40, 24),  # K, H and I not multiples of the blocks: masked tails
        (6, 4, 4, 96, 16),  # every token routes to every expert
        (3, 32, 1, 64, 32),
        (0, 16, 4, 64, 32),
    ],
)
def test_triton_matches_loop(
    tokens, experts, topk, hidden, inter, dtype, blocks, triton_launches
):  # fmt: skip
    shape = dict(experts=experts, hidden=hidden, inter=inter, topk=topk)
    x, w13, w2, w, ids = make_case(tokens, dtype, DEVICE, seed=tokens + topk, **shape)
    expected = moe_experts_loop(x, w13, w2, w, ids, SiluAndMul())
    out = moe_experts_triton(x, w13, w2, w, ids, SiluAndMul(), **blocks)
    assert out.dtype == dtype and out.shape == x.shape
    assert_close_to_loop(out, expected)
    launches = int(tokens > 0)
    assert triton_launches["_moe_gate_up_kernel"] == triton_launches["_moe_down_kernel"] == launches


# Kimi-K3's constants (O(1) GEMM outputs stay in tanh's linear part) and small ones (saturated).
SITU_CASES = [SITU, SituAndMul(0.5, 0.75)]


@pytest.mark.parametrize("act", SITU_CASES, ids=["k3", "saturated"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize(
    "tokens,experts,topk,hidden,inter", [(1, 16, 4, 64, 32), (5, 8, 3, 40, 24)]
)
def test_triton_situ_matches_loop(
    tokens, experts, topk, hidden, inter, dtype, act, triton_launches
):
    """SiTU in the gate/up kernel's epilogue, at the rounding points of `SituAndMul` (fp32 from the
    rounded GEMM outputs, rounded once)."""
    shape = dict(experts=experts, hidden=hidden, inter=inter, topk=topk)
    x, w13, w2, w, ids = make_case(tokens, dtype, DEVICE, seed=tokens + topk, **shape)
    expected = moe_experts_loop(x, w13, w2, w, ids, act)
    assert_close_to_loop(moe_experts_triton(x, w13, w2, w, ids, act), expected)
    assert triton_launches["_moe_gate_up_kernel"] == 1
    with pytest.raises(AssertionError):  # SiLU's result is not SiTU's
        assert_close_to_loop(moe_experts_triton(x, w13, w2, w, ids, SiluAndMul()), expected)


@pytest.mark.parametrize("tokens", [1, 5, 13])
def test_triton_fp32_matches_fp64_reference(tokens):
    x, w13, w2, w, ids = make_case(tokens, torch.float32, DEVICE)
    out = moe_experts_triton(x, w13, w2, w, ids, SiluAndMul(), **WIDE_BLOCKS).double().cpu()
    # As for the torch paths: fp32 accumulation of length-<=64 dot products of O(1) terms.
    torch.testing.assert_close(out, reference_fp64(x, w13, w2, w, ids, SiluAndMul()),
                               rtol=1.3e-6, atol=1e-5)  # fmt: skip


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_triton_shared_and_repeated_experts(dtype):
    x, w13, w2, w, _ = make_case(4, dtype, DEVICE, seed=4)
    # Tokens share experts in different slots; the last repeats one (the router never does,
    # but the sum defines it).
    ids = torch.tensor([[2, 5, 0, 7], [5, 2, 7, 0], [2, 3, 4, 5], [7, 7, 7, 7]], device=DEVICE)
    expected = moe_experts_loop(x, w13, w2, w, ids, SiluAndMul())
    out = moe_experts_triton(x, w13, w2, w, ids, SiluAndMul(), **WIDE_BLOCKS)
    assert_close_to_loop(out, expected)
    again = moe_experts_triton(x, w13, w2, w, ids, SiluAndMul(), **WIDE_BLOCKS)
    assert torch.equal(again, out)  # no atomics


@pytest.mark.parametrize("hidden", [64, 40])  # whole steps, and a masked last one
def test_triton_unrolled_gate_up_gives_the_loops_bits(hidden, triton_launches):
    """`gate_up_unroll` only unrolls the steps over H: same operations in the same order."""
    x, w13, w2, w, ids = make_case(3, torch.bfloat16, DEVICE, seed=9, hidden=hidden)
    blocks = dict(SMALL_BLOCKS, block_k=16)
    looped = moe_experts_triton(x, w13, w2, w, ids, SiluAndMul(), **blocks)
    unrolled = moe_experts_triton(x, w13, w2, w, ids, SiluAndMul(), **blocks, gate_up_unroll=True)
    assert torch.equal(unrolled, looped)
    assert triton_launches["_moe_gate_up_kernel"] == 2


def test_triton_reads_strided_router_outputs_and_int32_ids():
    x, w13, w2, w, ids = make_case(6, torch.bfloat16, DEVICE, seed=6)
    wide_x = torch.zeros(6, H + 8, dtype=x.dtype, device=DEVICE)
    wide_x[:, :H] = x
    wide_w = torch.zeros(6, 2 * K, device=DEVICE)
    wide_w[:, ::2] = w
    out = moe_experts_triton(wide_x[:, :H], w13, w2, wide_w[:, ::2], ids.int().t().contiguous().t(),
                             SiluAndMul(), **WIDE_BLOCKS)  # fmt: skip
    assert torch.equal(out, moe_experts_triton(x, w13, w2, w, ids, SiluAndMul(), **WIDE_BLOCKS))


def test_triton_rejects_bad_inputs(monkeypatch):
    x, w13, w2, w, ids = make_case(3, torch.float32, DEVICE)
    silu = SiluAndMul()
    cases = [
        ((x, w13[:, :, :-1], w2, w, ids, silu), {}, "w13 must be"),
        ((x, w13, w2[:, :, :-1], w, ids, silu), {}, "w2 must be"),
        ((x, w13, w2, w, ids[:2], silu), {}, "topk_ids must be"),
        ((x, w13, w2, w[:, :2], ids, silu), {}, "topk_weights shape"),
        ((x.bfloat16(), w13, w2, w, ids, silu), {}, "share one dtype"),
        ((x, w13, w2, w, ids.float(), silu), {}, "int32 / int64"),
        ((x, w13.transpose(1, 2).contiguous().transpose(1, 2), w2, w, ids, silu), {},
         "unit stride"),
        ((x, w13, w2, w, ids, UNFUSED), {}, "must be SiluAndMul or SituAndMul"),
        ((x, w13, w2, w, ids, silu), {"block_n": 24}, "block_n must be a positive power of two"),
        ((x, w13, w2, w, ids, silu), {"down_warps": 0}, "down_warps must be"),
    ]  # fmt: skip
    for args, blocks, match in cases:
        with pytest.raises(ValueError, match=match):
            moe_experts_triton(*args, **blocks)
    cpu = [t.cpu() for t in (x, w13, w2, w, ids)]
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    with pytest.raises(ValueError, match="needs a CUDA / ROCm device or TRITON_INTERPRET=1"):
        moe_experts_triton(*cpu, silu)


GPU_BLOCKS = [
    {},
    dict(gate_up_unroll=False, block_k=256, block_h=2, down_warps=2),
    dict(block_k=512),  # the default where 512 divides H; here 4.5 steps, the last masked
    dict(block_n=32, block_k=128, gate_up_warps=8, block_h=16, block_i=256, down_warps=8),
    dict(block_h=4, block_i=512, down_warps=4),
]


@pytest.mark.gpu
@pytest.mark.parametrize("act", [SILU, SITU], ids=["silu", "situ"])
@pytest.mark.parametrize("blocks", GPU_BLOCKS)
@pytest.mark.parametrize("tokens", [1, 8, 16])
def test_triton_kimi_linear_shapes_on_gpu(tokens, blocks, act):
    # Kimi-Linear's expert shapes (fewer experts, so tokens share them), top-8; SiTU: Kimi-K3's.
    shape = dict(experts=16, hidden=2304, inter=1024, topk=8)
    case = make_case(tokens, torch.bfloat16, "cuda", seed=tokens, **shape)
    out = moe_experts_triton(*case, act, **blocks)
    loop = moe_experts_loop(*case, act)
    expected = reference_fp64(*[t.cpu() for t in case], act)
    # The bf16 rounding bound that the loop meets on CPU (test_bf16_loop_is_within_...).
    bound = 4 * 2**-8 * expected.abs().max()
    assert (loop.double().cpu() - expected).abs().max() <= bound
    assert (out.double().cpu() - expected).abs().max() <= bound


# Tiles of the grouped Triton path small enough for the interpreter, with several steps over H
# and I and several output tiles per block.
GROUPED_BLOCKS = dict(block_m=16, block_n=16, block_k=32, down_block_n=32, down_block_k=16)
GROUPED_KERNELS = ("_moe_group_rows_kernel", "_moe_grouped_gate_up_kernel",
                   "_moe_grouped_down_kernel", "_moe_weighted_sum_kernel")  # fmt: skip


def skewed_ids(tokens, topk, device):
    """Every token routes to experts 0..topk-1: `tokens` rows each (several blocks of 16), and
    the other experts get none."""
    return torch.arange(topk, device=device).repeat(tokens, 1)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize(
    "tokens,topk,hidden,inter,skewed",
    [
        (1, 2, 64, 32, False),  # six of eight experts get no row
        (17, 2, 64, 32, False),
        (40, 4, 64, 32, False),  # 20 rows per expert on average: experts span two blocks
        (40, 4, 64, 32, True),  # four experts of 40 rows (three blocks each), four of none
        (9, 3, 40, 24, False),  # H and I not multiples of the tiles: masked tails
    ],
)
def test_triton_grouped_matches_loop(tokens, topk, hidden, inter, skewed, dtype, triton_launches):
    shape = dict(experts=8, hidden=hidden, inter=inter, topk=topk)
    x, w13, w2, w, ids = make_case(tokens, dtype, DEVICE, seed=tokens + topk, **shape)
    if skewed:
        ids = skewed_ids(tokens, topk, DEVICE)
    expected = moe_experts_loop(x, w13, w2, w, ids, SiluAndMul())
    out = moe_experts_triton_grouped(x, w13, w2, w, ids, SiluAndMul(), **GROUPED_BLOCKS)
    assert out.dtype == dtype and out.shape == x.shape
    assert_close_to_loop(out, expected)
    assert [triton_launches[name] for name in GROUPED_KERNELS] == [1, 1, 1, 1]


@pytest.mark.parametrize("act", SITU_CASES, ids=["k3", "saturated"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_triton_grouped_situ_matches_loop(dtype, act, triton_launches):
    shape = dict(experts=8, hidden=40, inter=24, topk=4)
    x, w13, w2, w, ids = make_case(40, dtype, DEVICE, seed=3, **shape)
    expected = moe_experts_loop(x, w13, w2, w, ids, act)
    out = moe_experts_triton_grouped(x, w13, w2, w, ids, act, **GROUPED_BLOCKS)
    assert_close_to_loop(out, expected)
    assert triton_launches["_moe_grouped_gate_up_kernel"] == 1
    with pytest.raises(AssertionError):  # SiLU's result is not SiTU's
        silu = moe_experts_triton_grouped(x, w13, w2, w, ids, SiluAndMul(), **GROUPED_BLOCKS)
        assert_close_to_loop(silu, expected)


@pytest.mark.parametrize("act", [*SITU_CASES, SILU], ids=["k3", "saturated", "silu"])
@pytest.mark.parametrize("path", ["gemv", "grouped"])
def test_triton_activation_rounds_where_its_module_does(path, act, triton_launches):
    """The gate/up epilogue's rounding points. One slot a token, weight 1 and identity down
    weights make the output the activation's product itself, and the gate and up sums are exact in
    fp32 but not in bf16 (multiples of 2^-10 around 0.5: 10 significant bits), so rounding them
    first, then SiTU's one rounding or SiLU's two, decide the bf16 result: equal to the loop's but
    for rare one-ulp flips where the interpreter's fp32 exp or tanh lands on the other side of a
    rounding boundary than torch's (one extra or one missing rounding moves a quarter or more of
    the elements)."""
    gen = torch.Generator().manual_seed(11)
    tokens, experts, hidden = (48 if path == "grouped" else 4), 4, 64
    x = torch.randint(-2, 3, (tokens, hidden), generator=gen).to(DEVICE, torch.bfloat16)
    w13 = torch.randint(-64, 65, (experts, 2 * hidden, hidden), generator=gen) * 2.0**-10
    w13 = w13.to(DEVICE, torch.bfloat16)
    w2 = torch.eye(hidden).expand(experts, hidden, hidden).to(DEVICE, torch.bfloat16).contiguous()
    ids = torch.randint(0, experts, (tokens, 1), generator=gen).to(DEVICE)
    w = torch.ones(tokens, 1, device=DEVICE)
    if path == "gemv":
        got = moe_experts_triton(x, w13, w2, w, ids, act)
    else:
        got = moe_experts_triton_grouped(x, w13, w2, w, ids, act, **GROUPED_BLOCKS)
    want = moe_experts_loop(x, w13, w2, w, ids, act)
    assert want.abs().max() > 0.1  # not all in a flat region
    differ = got != want
    assert differ.float().mean() <= 0.01
    ulp = 2.0 ** (torch.frexp(want.float()).exponent - 8).float()
    assert ((got.float() - want.float()).abs() <= ulp).all()


def test_fused_activation_kinds_and_constants():
    from vllm.model_executor.layers.fused_moe import fused_activation as fa

    assert fa.fused_activation(SILU) == (fa.SILU, 1.0, 1.0)
    assert fa.fused_activation(SituAndMul(0.5, 0.75)) == (fa.SITU, 0.5, 0.75)
    assert fa.fused_activation(UNFUSED) is None and fa.fused_activation(torch.nn.SiLU()) is None


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize(
    "tokens,topk,hidden,inter,skewed",
    [
        (40, 4, 64, 32, True),  # experts of three blocks, the last partial: rows past a block
        (9, 3, 40, 24, False),  # tiles past the gate rows (into up) and past H and I
    ],
)
def test_triton_grouped_tma_gives_the_pointer_loads_bits(tokens, topk, hidden, inter, skewed,
                                                         dtype, monkeypatch):  # fmt: skip
    """Through TMA descriptors the kernels multiply the same values in the same order: the same
    bits as the pointer loads (bf16), even where a tile reads past its expert's or block's
    rows."""
    shape = dict(experts=8, hidden=hidden, inter=inter, topk=topk)
    x, w13, w2, w, ids = make_case(tokens, dtype, DEVICE, seed=tokens + topk, **shape)
    if skewed:
        ids = skewed_ids(tokens, topk, DEVICE)
    pointer = moe_experts_triton_grouped(x, w13, w2, w, ids, SiluAndMul(), **GROUPED_BLOCKS,
                                         tma=False)  # fmt: skip
    gate_up = record_launches(monkeypatch, experts_triton_grouped, "_moe_grouped_gate_up_kernel")
    down = record_launches(monkeypatch, experts_triton_grouped, "_moe_grouped_down_kernel")
    tma = moe_experts_triton_grouped(x, w13, w2, w, ids, SiluAndMul(), **GROUPED_BLOCKS,
                                     tma=True)  # fmt: skip
    assert [kw["TMA"] for kw in gate_up + down] == [True, True]
    if dtype == torch.bfloat16:
        assert torch.equal(tma, pointer)
    # fp32: the interpreter's IEEE dot is numpy's matmul, whose summation order follows the
    # operands' layout (a transposed tile here), so only the closeness to the loop is checked.
    assert_close_to_loop(tma, moe_experts_loop(x, w13, w2, w, ids, SiluAndMul()))


def tail_ids(device):
    """56 tokens of top-2 over 8 experts: expert 0 gets 56 rows (blocks of 32 and 24 at
    block_m 32), expert 1 gets 48 (32 and exactly 16), expert 2 gets 8 (one block)."""
    second = torch.where(torch.arange(56) < 48, 1, 2)
    return torch.stack([torch.zeros(56, dtype=torch.long), second], dim=1).to(device)


def spy_block_rows(monkeypatch):
    """The BLOCK_M each program's block code runs with (gate/up and down), as the interpreter
    calls the kernels' helpers."""
    seen = {"_gate_up_block": [], "_down_block": []}
    for name, at in (("_gate_up_block", 18), ("_down_block", 16)):
        helper = getattr(experts_triton_grouped, name)

        def spy(*args, helper=helper, rows=seen[name], at=at):
            rows.append(int(getattr(args[at], "value", args[at])))
            return helper(*args)

        monkeypatch.setattr(experts_triton_grouped, name, spy)
    return seen


@pytest.mark.parametrize("tma", [False, True], ids=["ptr", "tma"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_triton_grouped_tail_tiles_give_the_full_tiles_results(dtype, tma, monkeypatch):
    """Blocks of at most tail_block_m rows (expert 1's last of exactly 16, expert 2's only one
    of 8) run on the smaller tiles, expert 0's last of 24 rows on the full ones: every row's
    products are the same, in the same order (bf16: the same bits as without tail tiles)."""
    x, w13, w2, w, _ = make_case(56, dtype, DEVICE, seed=5, experts=8, hidden=64, inter=48,
                                 topk=2)  # fmt: skip
    ids = tail_ids(DEVICE)
    blocks = dict(GROUPED_BLOCKS, block_m=32, tma=tma)
    full = moe_experts_triton_grouped(x, w13, w2, w, ids, SiluAndMul(), **blocks)
    launched = [
        record_launches(monkeypatch, experts_triton_grouped, name)
        for name in ("_moe_grouped_gate_up_kernel", "_moe_grouped_down_kernel")
    ]
    seen = spy_block_rows(monkeypatch)
    tail = moe_experts_triton_grouped(x, w13, w2, w, ids, SiluAndMul(), **blocks,
                                      tail_block_m=16)  # fmt: skip
    assert [kw["TAIL_M"] for kws in launched for kw in kws] == [16, 16]
    # Blocks of 32, 24, 32, 16 and 8 rows, each program once per output tile.
    gate_up_tiles, down_tiles = 48 // 16, 64 // 32
    assert sorted(seen["_gate_up_block"]) == [16] * 2 * gate_up_tiles + [32] * 3 * gate_up_tiles
    assert sorted(seen["_down_block"]) == [16] * 2 * down_tiles + [32] * 3 * down_tiles
    if dtype == torch.bfloat16:
        assert torch.equal(tail, full)
    assert_close_to_loop(tail, moe_experts_loop(x, w13, w2, w, ids, SiluAndMul()))


def test_triton_grouped_tail_default_goes_with_the_default_blocks(monkeypatch):
    """Left to the defaults on a device with TMA, the 128-row prefill tiles take their 64-row
    tail tiles; a caller who chooses the blocks gets none unless asked (a 64-row block could not
    take a 64-row tail)."""
    x, w13, w2, w, ids = make_case(64, torch.bfloat16, DEVICE, seed=3, experts=8, hidden=64,
                                   inter=32, topk=8)  # fmt: skip
    monkeypatch.setattr(experts_triton_grouped, "supports_tma", lambda device: True)
    monkeypatch.setattr(experts_triton_grouped, "PREFILL_TILES_ABOVE_ROWS", 0)
    monkeypatch.setattr(experts_triton_grouped, "LARGE_PREFILL_TILES_FROM_ROWS", ids.numel())
    launched = record_launches(monkeypatch, experts_triton_grouped, "_moe_grouped_gate_up_kernel")
    default = moe_experts_triton_grouped(x, w13, w2, w, ids, SiluAndMul())
    chosen = moe_experts_triton_grouped(x, w13, w2, w, ids, SiluAndMul(), block_m=64)
    assert [(kw["BLOCK_M"], kw["TAIL_M"]) for kw in launched] == [(128, 64), (64, 0)]
    expected = moe_experts_loop(x, w13, w2, w, ids, SiluAndMul())
    assert_close_to_loop(default, expected)
    assert_close_to_loop(chosen, expected)


@pytest.mark.parametrize("tail_block_m", [8, 24, 32, 64])
def test_triton_grouped_refuses_a_bad_tail_block_m(tail_block_m):
    x, w13, w2, w, ids = make_case(5, torch.bfloat16, DEVICE, experts=8, hidden=64, inter=32,
                                   topk=2)  # fmt: skip
    with pytest.raises(ValueError, match="tail_block_m"):
        blocks = dict(GROUPED_BLOCKS, block_m=32, tail_block_m=tail_block_m)
        moe_experts_triton_grouped(x, w13, w2, w, ids, SiluAndMul(), **blocks)


def test_triton_grouped_tma_needs_weights_tma_can_address(monkeypatch):
    x, w13, w2, w, ids = make_case(5, torch.bfloat16, DEVICE, experts=8, hidden=64, inter=32,
                                   topk=2)  # fmt: skip
    strided = torch.empty(8, 2 * 32, 72, dtype=w13.dtype, device=DEVICE)[:, :, :64]
    strided.copy_(w13)
    odd = torch.zeros(8, 64, 36, dtype=w2.dtype, device=DEVICE)  # rows of 72 bytes
    assert experts_triton_grouped.tma_operands_ok(w13, w2)
    assert not experts_triton_grouped.tma_operands_ok(strided, w2)
    assert not experts_triton_grouped.tma_operands_ok(w13, odd)
    with pytest.raises(ValueError, match="tma needs contiguous"):
        moe_experts_triton_grouped(x, strided, w2, w, ids, SiluAndMul(), **GROUPED_BLOCKS,
                                   tma=True)  # fmt: skip
    # Asked for on a device without TMA (here: the CPU, were it not the interpreter's).
    with monkeypatch.context() as mp:
        mp.setattr(experts_triton_grouped, "triton_interpreting", lambda: False)
        with pytest.raises(ValueError, match="tma needs an NVIDIA GPU from Hopper on"):
            moe_experts_triton_grouped(x, w13, w2, w, ids, SiluAndMul(), **GROUPED_BLOCKS,
                                       tma=True)  # fmt: skip
    # Left to the default on a device with TMA, the prefill tiles take it only for weights it can
    # address: not for the strided ones, nor for ones 2 bytes past 16-byte alignment.
    monkeypatch.setattr(experts_triton_grouped, "supports_tma", lambda device: True)
    monkeypatch.setattr(experts_triton_grouped, "PREFILL_TILES_ABOVE_ROWS", 0)
    flat = torch.empty(w13.numel() + 8, dtype=w13.dtype, device=DEVICE)
    misaligned = flat[1 : 1 + w13.numel()].view(w13.shape)
    misaligned.copy_(w13)
    assert not experts_triton_grouped.tma_operands_ok(misaligned, w2)
    for weights, takes_tma in ((w13, True), (strided, False), (misaligned, False)):
        down = record_launches(monkeypatch, experts_triton_grouped, "_moe_grouped_down_kernel")
        out = moe_experts_triton_grouped(x, weights, w2, w, ids, SiluAndMul(), **GROUPED_BLOCKS)
        assert [kw["TMA"] for kw in down] == [takes_tma]
        assert_close_to_loop(out, moe_experts_loop(x, w13, w2, w, ids, SiluAndMul()))


@pytest.mark.parametrize(
    "threshold,block_m",
    [("PREFILL_TILES_ABOVE_ROWS", 64), ("LARGE_PREFILL_TILES_FROM_ROWS", 128)],
)
def test_triton_grouped_default_prefill_tiles_match_loop(threshold, block_m, monkeypatch,
                                                         triton_launches):  # fmt: skip
    # 512 rows (64 per expert) take the prefill tiles once the threshold is lowered to them: the
    # interpreter is too slow at the real thresholds' sizes (the GPU test runs those).
    x, w13, w2, w, ids = make_case(64, torch.bfloat16, DEVICE, seed=block_m, experts=8,
                                   hidden=64, inter=32, topk=8)  # fmt: skip
    lowered = ids.numel() - 1 if threshold.endswith("ABOVE_ROWS") else ids.numel()
    monkeypatch.setattr(experts_triton_grouped, threshold, lowered)
    assert experts_triton_grouped.default_tiles(ids.numel()).block_m == block_m
    # The gate/up launch's BLOCK_M: the tiles the launcher actually took.
    launched = record_launches(monkeypatch, experts_triton_grouped, "_moe_grouped_gate_up_kernel")
    out = moe_experts_triton_grouped(x, w13, w2, w, ids, SiluAndMul())
    assert_close_to_loop(out, moe_experts_loop(x, w13, w2, w, ids, SiluAndMul()))
    assert [triton_launches[name] for name in GROUPED_KERNELS[1:]] == [1, 1, 1]
    assert [kw["BLOCK_M"] for kw in launched] == [block_m]


def test_default_tiles_keep_to_the_devices_shared_memory():
    tiles, h200, a100, ada = experts_triton_grouped.default_tiles, 232448, 166912, 101376
    assert [tiles(r).block_m for r in (32, 1024, 4096, 4097, 32768)] == [16, 32, 32, 64, 128]
    assert tiles(4097, 2, h200).block_m == 64 and tiles(32768, 2, h200).block_m == 128
    # A100: the 128-row tiles' 144 KB fit with headroom, the 64-row tiles' 160 KB do not.
    assert tiles(32768, 2, a100).block_m == 128 and tiles(4097, 2, a100).block_m == 32
    assert tiles(32768, 2, ada) == tiles(4096, 2, ada) == tiles(4096)  # decode tiles
    assert tiles(32768, 2, 0) == tiles(4096)  # no size reported (ROCm): decode tiles
    assert tiles(32768, 4).block_m == 32  # fp32: the decode tiles
    load = experts_triton_grouped.load_buffer_bytes
    assert load(tiles(4097), 2) == 160 * 1024 and load(tiles(32768), 2) == 144 * 1024
    # With TMA the prefill tiles (and only they) take it; the 128-row gate/up kernel a 4th stage
    # and the down kernel 256-wide tiles at 4, which an H200 holds (192 KB each) and an A100
    # would not.
    for rows in (32, 1024, 4096):
        assert tiles(rows, 2, h200, tma=True) == tiles(rows)
    assert tiles(4097, 2, h200, tma=True) == tiles(4097)._replace(tma=True)
    large = tiles(32768, 2, h200, tma=True)
    assert large == tiles(32768)._replace(
        gate_up_stages=4, down_block_n=256, down_stages=4, tma=True, tail_block_m=64
    )
    assert load(large, 2) == 192 * 1024
    assert load(large._replace(gate_up_stages=3), 2) == 192 * 1024  # the down kernel's
    assert tiles(32768, 2, a100, tma=True).block_m == 32
    assert tiles(32768, 4, tma=True) == tiles(32768, 4)  # fp32: the decode tiles


class _LaunchChoices:
    """Stands in for a kernel: each launch appends its kernel's name and keyword arguments (the
    constexprs and options) and runs nothing."""

    def __init__(self, name: str, launches: list) -> None:
        self._name, self._launches = name, launches

    def __getitem__(self, grid):
        return lambda *args, **kwargs: self._launches.append((self._name, kwargs))


def test_default_launch_is_the_batch_class_launch(monkeypatch):
    # An eager decode of n tokens (every decode step under --enforce-eager) groups its rows and
    # runs the grouped experts with the launches of the graph its batch class would replay: at
    # top-8 + shared, 9n rows crossed the 32-row blocks' threshold (n = 114 in the class of 120),
    # the prefill tiles' (n = 456 in 464) and a power of two of the grouping's rows per step
    # (n = 29 in 32) inside a class, each a Triton compile in the step.
    launches = []
    for module, name in (
        (group_rows_module, "_moe_group_rows_kernel"),
        (experts_triton_grouped, "_moe_grouped_gate_up_kernel"),
        (experts_triton_grouped, "_moe_grouped_down_kernel"),
        (weighted_sum_module, "_moe_weighted_sum_kernel"),
    ):
        monkeypatch.setattr(module, name, _LaunchChoices(name, launches))
    w13 = torch.zeros(257, 32, 16, dtype=torch.bfloat16, device=DEVICE)
    w2 = torch.zeros(257, 16, 16, dtype=torch.bfloat16, device=DEVICE)

    def choices(n):
        launches.clear()
        ids = torch.zeros(n, 9, dtype=torch.int64, device=DEVICE)
        x = torch.zeros(n, 16, dtype=torch.bfloat16, device=DEVICE)
        moe_experts_triton_grouped(x, w13, w2, torch.zeros(n, 9, device=DEVICE), ids, SiluAndMul())
        return list(launches)

    for n in range(1, 600):
        assert choices(n) == choices(decode_batch_class(n)), n


def test_triton_grouped_fp32_matches_fp64_reference():
    x, w13, w2, w, ids = make_case(37, torch.float32, DEVICE, experts=8)
    out = moe_experts_triton_grouped(x, w13, w2, w, ids, SiluAndMul(), **GROUPED_BLOCKS)
    # As for the other paths: fp32 accumulation of length-<=64 dot products of O(1) terms.
    torch.testing.assert_close(out.double().cpu(), reference_fp64(x, w13, w2, w, ids, SiluAndMul()),
                               rtol=1.3e-6, atol=1e-5)  # fmt: skip


def grouping_ids(case, gen):
    """`[T, K]` ids over 8 experts for `test_group_rows_matches_reference`."""
    experts = 8
    if case == "skewed":
        return skewed_ids(40, 4, "cpu")
    if case == "one_row":
        return torch.tensor([[5]])
    if case == "empty_experts":  # only experts 2 and 5, many repeats
        return torch.tensor([2, 5])[torch.randint(0, 2, (37, 3), generator=gen)]
    if case == "out_of_range":  # -1, E and beyond mixed with valid ids
        return torch.randint(-3, experts + 3, (23, 4), generator=gen)
    if case == "chunks":  # several 2048-id steps of the kernel, the last one partial
        return torch.randint(0, experts, (700, 9), generator=gen)
    ids = torch.rand(40, experts, generator=gen).topk(4, dim=1)[1]
    return ids.int() if case == "int32" else ids


@pytest.mark.parametrize("block_m", [16, 32])
@pytest.mark.parametrize(
    "case", ["random", "skewed", "one_row", "int32", "empty_experts", "out_of_range", "chunks"]
)
def test_group_rows_matches_reference(case, block_m, triton_launches):
    experts = 8
    ids = grouping_ids(case, torch.Generator().manual_seed(block_m)).to(DEVICE)
    got = group_rows(ids, experts, block_m)
    expected = group_rows_reference(ids, experts, block_m)
    assert triton_launches["_moe_group_rows_kernel"] == 1
    for name, a, b in zip(got._fields, got, expected, strict=True):
        assert a.dtype == b.dtype == torch.int32, name
        assert torch.equal(a, b), name
    # The reference itself: a stable sort with out-of-range rows last, its inverse, the ends,
    # and used blocks that tile the valid rows in order, each within one expert, <= block_m rows.
    order, inverse, table, offs = (t.cpu().long() for t in expected)
    flat = ids.reshape(-1).cpu().long()
    num_rows = flat.numel()
    valid = (flat >= 0) & (flat < experts)
    keys = torch.where(valid, flat, experts)
    assert torch.equal(keys[order], keys.sort(stable=True)[0])
    for e in range(experts + 1):
        rows = order[keys[order] == e]
        assert torch.equal(rows, rows.sort()[0])  # token order within an expert
    assert torch.equal(inverse[order], torch.arange(num_rows))
    assert torch.equal(offs, torch.bincount(keys, minlength=experts + 1)[:experts].cumsum(0))
    assert table.shape == (3, max_blocks_for(num_rows, experts, block_m))
    expert, row0, row1 = table
    used = expert >= 0
    assert bool(used[: int(used.sum())].all())  # used blocks first
    covered = [torch.arange(a, b) for a, b in zip(row0[used], row1[used], strict=True)]
    assert torch.equal(torch.cat(covered), torch.arange(int(valid.sum())))
    assert bool(((row1 - row0)[used] <= block_m).all() and ((row1 - row0)[used] > 0).all())
    assert torch.equal(keys[order][: int(valid.sum())],
                       torch.repeat_interleave(expert[used], (row1 - row0)[used]))  # fmt: skip
    assert not bool(row0[~used].any() or row1[~used].any())


@pytest.mark.parametrize("chunk", [16, 64])
@pytest.mark.parametrize(
    "case", ["random", "skewed", "one_row", "int32", "empty_experts", "out_of_range"]
)
def test_group_rows_chunked_matches_reference(case, chunk, triton_launches):
    """The two-launch grouping of large batches, on small chunks (many per batch, the last one
    partial): the reference's order, inverse, block table and ends exactly."""
    experts = 8
    ids = grouping_ids(case, torch.Generator().manual_seed(chunk)).to(DEVICE)
    for block_m in (16, 32):
        got = group_rows_chunked(ids.reshape(-1), experts, block_m, chunk)
        expected = group_rows_reference(ids, experts, block_m)
        for name, a, b in zip(got._fields, got, expected, strict=True):
            assert a.dtype == b.dtype == torch.int32, name
            assert torch.equal(a, b), name
    assert triton_launches["_moe_group_count_kernel"] == 2
    assert triton_launches["_moe_group_place_kernel"] == 2


@pytest.mark.skipif(native_specialize_impl is None, reason="needs Triton's CUDA specialization")
def test_group_rows_chunked_keys_follow_the_row_count_alone(monkeypatch):
    """Prefill-sized groupings (Kimi-Linear's 257 experts, top-8 + shared) whose row counts are
    all multiples of 16 but whose chunk counts (17, 32, 36) and block-table widths (512, 751,
    830) fall in different classes of Triton's specialization: one Triton key per kernel, so no
    step compiles the placing kernel again (4.2-4.4 s on a fresh H100, docs/performance.md
    "Forty-first run")."""
    log, phase = [], ["prefill"]
    for name in ("_moe_group_count_kernel", "_moe_group_place_kernel"):
        kernel = getattr(group_rows_module, name)
        monkeypatch.setattr(group_rows_module, name, KeyRecorder(name, kernel, log, phase))
    block_m, rows_each = 128, [tokens * 9 for tokens in (3664, 7056, 8192)]
    for rows in rows_each:
        assert rows % 16 == 0 and rows > group_rows_module.GROUP_KERNEL_MAX_ROWS
        group_rows_chunked(torch.zeros(rows, dtype=torch.int32), 257, block_m)
    chunks = [-(-rows // 2048) for rows in rows_each]
    widths = [max_blocks_for(rows, 257, block_m) for rows in rows_each]
    assert (chunks, widths) == ([17, 32, 36], [512, 751, 830])
    keys = {name: {key for _, n, key in log if n == name} for _, name, _ in log}
    assert {name: len(k) for name, k in keys.items()} == {
        "_moe_group_count_kernel": 1, "_moe_group_place_kernel": 1,
    }  # fmt: skip


@pytest.mark.parametrize("limit", [None, 8])  # the one-launch kernel; the chunked kernels
def test_group_rows_reads_column_strided_ids(limit, monkeypatch):
    """A `[T, K]` view with a column stride (every other column of a wider tensor) flattens to a
    strided view; both kernels must group its ids, not the wider tensor's."""
    if limit is not None:
        monkeypatch.setattr(group_rows_module, "GROUP_KERNEL_MAX_ROWS", limit)
    wide = torch.randint(0, 8, (6, 8), generator=torch.Generator().manual_seed(3)).to(DEVICE)
    ids = wide[:, ::2]
    got = group_rows(ids, 8, 16)
    expected = group_rows_reference(ids.contiguous(), 8, 16)
    for name, a, b in zip(got._fields, got, expected, strict=True):
        assert torch.equal(a, b), name
    with pytest.raises(ValueError, match="unit stride"):
        group_rows_chunked(wide.reshape(-1)[::2], 8, 16)
    with pytest.raises(ValueError, match="power of two"):
        group_rows_chunked(wide.reshape(-1), 8, 16, chunk=12)


@pytest.mark.parametrize("experts", [6, 257])
def test_group_rows_takes_the_chunked_kernels_past_the_one_launch_limit(
    experts, triton_launches, monkeypatch
):
    """Past GROUP_KERNEL_MAX_ROWS `group_rows` takes the chunked launches (one chunk of 2048
    here): E + 2 bins a power of two (6), and Kimi-Linear's 257; out-of-range ids."""
    monkeypatch.setattr(group_rows_module, "GROUP_KERNEL_MAX_ROWS", 64)
    gen = torch.Generator().manual_seed(experts)
    ids = torch.randint(-1, experts + 2, (150, 9), generator=gen).to(DEVICE)
    got = group_rows(ids, experts, 16)
    assert triton_launches["_moe_group_count_kernel"] == 1
    assert triton_launches["_moe_group_rows_kernel"] == 0
    for name, a, b in zip(got._fields, got, group_rows_reference(ids, experts, 16), strict=True):
        assert torch.equal(a, b), name


def check_reference_sorts_ids(experts, device):
    """The reference sorts narrowed keys (int16 below 2**15 experts): the order of a stable sort
    of the int64 ids (out-of-range ones last, on the host), at a prefill's size (8192 tokens,
    top-8 + shared), with out-of-range ids that int16 would wrap onto valid ones."""
    gen = torch.Generator().manual_seed(experts)
    ids = torch.randint(0, experts, (8192, 9), generator=gen)
    wrapping = torch.tensor([-1, experts, 2**16 + 5, -(2**16) + 7, 2**15, 2**40])
    ids.view(-1)[torch.randperm(ids.numel(), generator=gen)[:600]] = wrapping.repeat(100)
    flat = ids.reshape(-1)
    keys = torch.where((flat >= 0) & (flat < experts), flat, experts)
    got = [t.cpu().long() for t in group_rows_reference(ids.to(device), experts, 32)]
    order, inverse, _, offs = got
    assert torch.equal(order, keys.sort(stable=True)[1])
    assert torch.equal(inverse[order], torch.arange(flat.numel()))
    assert torch.equal(offs, torch.bincount(keys, minlength=experts + 1)[:-1].cumsum(0))


@pytest.mark.parametrize("experts", [257, 2**15 + 3])
def test_group_rows_reference_orders_as_a_sort_of_the_ids(experts):
    check_reference_sorts_ids(experts, "cpu")


@pytest.mark.gpu
@pytest.mark.parametrize("experts", [257, 2**15 + 3])
def test_group_rows_reference_orders_as_a_sort_of_the_ids_on_gpu(experts):
    """CUDA's radix sort of the int16 keys (what a prefill of 8192 tokens runs)."""
    check_reference_sorts_ids(experts, "cuda")


def test_group_rows_of_no_rows_and_bad_arguments(triton_launches):
    got = group_rows(torch.empty(0, 4, dtype=torch.int64, device=DEVICE), 8, 16)
    assert [tuple(t.shape) for t in got] == [(0,), (0,), (3, 0), (8,)]
    assert not bool(got.offs.any()) and triton_launches["_moe_group_rows_kernel"] == 0
    ids = torch.zeros(2, 2, dtype=torch.int64)
    for args, match in [((ids.float(), 8, 16), "topk_ids must be int32 or int64"),
                        ((ids, 0, 16), "num_experts must be >= 1"),
                        ((ids, 8, 0), "block_m must be >= 1")]:  # fmt: skip
        for fn in (group_rows, group_rows_reference):
            with pytest.raises(ValueError, match=match):
                fn(*args)


def test_triton_grouped_is_deterministic_and_reads_strided_inputs():
    x, w13, w2, w, ids = make_case(20, torch.bfloat16, DEVICE, seed=5, experts=8)
    out = moe_experts_triton_grouped(x, w13, w2, w, ids, SiluAndMul(), **GROUPED_BLOCKS)
    wide_x = torch.zeros(20, H + 8, dtype=x.dtype, device=DEVICE)
    wide_x[:, :H] = x
    wide_w = torch.zeros(20, 2 * K, device=DEVICE)
    wide_w[:, ::2] = w
    again = moe_experts_triton_grouped(wide_x[:, :H], w13, w2, wide_w[:, ::2], ids.int(),
                                       SiluAndMul(), **GROUPED_BLOCKS)  # fmt: skip
    assert torch.equal(again, out)  # no atomics: bit-identical


def test_triton_grouped_rejects_bad_inputs():
    x, w13, w2, w, ids = make_case(3, torch.float32, DEVICE, experts=8)
    silu = SiluAndMul()
    cases = [
        ((x, w13[:, :, :-1], w2, w, ids, silu), {}, "w13 must be"),
        ((x, w13, w2, w[:, :2], ids, silu), {}, "topk_weights shape"),
        ((x.bfloat16(), w13, w2, w, ids, silu), {}, "share one dtype"),
        ((x, w13, w2, w, ids, UNFUSED), {}, "must be SiluAndMul or SituAndMul"),
        ((x, w13, w2, w, ids, silu), {"block_m": 8}, "block_m must be >= 16"),
        ((x, w13, w2, w, ids, silu), {"down_block_k": 48}, "down_block_k must be a positive"),
        ((x, w13, w2, w, ids, silu), {"gate_up_stages": 0}, "gate_up_stages must be >= 1"),
    ]  # fmt: skip
    for args, blocks, match in cases:
        with pytest.raises(ValueError, match=match):
            moe_experts_triton_grouped(*args, **blocks)


def test_triton_grouped_refuses_rows_past_int32_offsets(triton_launches):
    # 65536 tokens x 256 slots of 128 intermediate channels: `a` would hold 2**31 elements.
    tokens, experts, hidden, inter = 65536, 256, 16, 128
    x = torch.zeros(tokens, hidden)
    w13, w2 = torch.zeros(experts, 2 * inter, hidden), torch.zeros(experts, hidden, inter)
    ids = torch.arange(experts, dtype=torch.int32).repeat(tokens, 1)
    weights = torch.ones(tokens, experts)
    with pytest.raises(ValueError, match="exceed 2\\*\\*31 elements"):
        moe_experts_triton_grouped(x, w13, w2, weights, ids, SiluAndMul())
    assert sum(triton_launches.values()) == 0


def test_triton_grouped_empty_batch_is_zeros(triton_launches):
    x, w13, w2, w, ids = make_case(0, torch.bfloat16, DEVICE, experts=8)
    out = moe_experts_triton_grouped(x, w13, w2, w, ids, SiluAndMul())
    assert out.shape == (0, H) and sum(triton_launches[n] for n in GROUPED_KERNELS) == 0


KIMI_LINEAR = dict(experts=256, hidden=2304, inter=1024, topk=8)


def _fp64_loop(case, act=SILU):
    """The loop on fp64 operands on the case's device: GEMMs and activation in fp64 (SiTU in
    fp32, as `SituAndMul` computes), the weighted sum in fp32 (the per-row fp64 reference is too
    slow at these sizes)."""
    x, w13, w2, w, ids = case
    return moe_experts_loop(x.double(), w13.double(), w2.double(), w, ids, act)


@pytest.mark.gpu
@pytest.mark.parametrize("act", [SILU, SITU], ids=["silu", "situ"])
@pytest.mark.parametrize("experts", [256, 16])  # 16: many rows per expert, several blocks each
@pytest.mark.parametrize("tokens", [32, 64, 256, 1024, 4096])  # 1024, 4096: the prefill tiles
def test_triton_grouped_kimi_linear_shapes_on_gpu(tokens, experts, act):
    shape = dict(KIMI_LINEAR, experts=experts)
    case = make_case(tokens, torch.bfloat16, "cuda", seed=tokens, **shape)
    out = moe_experts_triton_grouped(*case, act)
    loop = moe_experts_loop(*case, act)
    expected = _fp64_loop(case, act)
    # The bf16 rounding bound that the loop meets on CPU (test_bf16_loop_is_within_...).
    bound = 4 * 2**-8 * expected.abs().max()
    assert (loop.double() - expected).abs().max() <= bound
    assert (out.double() - expected).abs().max() <= bound


@pytest.mark.gpu
@pytest.mark.parametrize("tokens", [8192, 4096, 600])  # the large and the 64-row prefill tiles
def test_triton_grouped_tma_gives_the_pointer_loads_bits_on_gpu(tokens, monkeypatch):
    if not supports_tma(torch.device("cuda")):
        pytest.skip("TMA descriptors need an NVIDIA GPU from Hopper on")
    case = make_case(tokens, torch.bfloat16, "cuda", seed=tokens, **dict(KIMI_LINEAR, experts=257))
    pointer = moe_experts_triton_grouped(*case, SiluAndMul(), tma=False)
    launched = record_launches(monkeypatch, experts_triton_grouped, "_moe_grouped_down_kernel")
    tma = moe_experts_triton_grouped(*case, SiluAndMul())  # the default on this GPU
    assert [kw["TMA"] for kw in launched] == [True]
    assert torch.equal(tma, pointer)


@pytest.mark.gpu
@pytest.mark.parametrize("tokens", [8192, 600, 64])  # TMA: 128- / 64-row tiles; decode tiles
def test_triton_grouped_reused_launches_give_tritons_dispatch_bits_on_gpu(tokens, monkeypatch):
    """Calls after the first launch the grouped kernels through `launch`'s fast path: the TMA
    descriptors handed to Triton's launcher as they are, placeholders where no descriptor is
    read. The bits of Triton's own dispatch."""
    case = make_case(tokens, torch.bfloat16, "cuda", seed=tokens, **dict(KIMI_LINEAR, experts=257))
    with monkeypatch.context() as plain_only:
        plain_only.setattr(launch_module, "_FAST", False)
        plain = moe_experts_triton_grouped(*case, SiluAndMul())
    moe_experts_triton_grouped(*case, SiluAndMul())  # a launch key's first call: Triton's
    dispatched = []
    for name in ("_moe_grouped_gate_up_kernel", "_moe_grouped_down_kernel"):
        kernel = getattr(experts_triton_grouped, name)

        def counted(*args, kernel=kernel, name=name, **kwargs):
            dispatched.append(name)
            return type(kernel).run(kernel, *args, **kwargs)

        monkeypatch.setattr(kernel, "run", counted, raising=False)
    fast = moe_experts_triton_grouped(*case, SiluAndMul())
    assert dispatched == []  # both launches skipped Triton's dispatch
    assert torch.equal(fast, plain)


@pytest.mark.gpu
@pytest.mark.parametrize("rows", [PREFILL_TILES_ABOVE_ROWS + 1, LARGE_PREFILL_TILES_FROM_ROWS])
@pytest.mark.parametrize(
    "tokens,experts,hidden,inter,topk",
    [(300, 9, 2056, 1000, 4), (1, 2, 2304, 1024, 2)],  # tiles past H and I; one token's rows
)
def test_triton_grouped_tma_past_the_tensors_on_gpu(tokens, experts, hidden, inter, topk, rows):
    """The hardware's TMA where tiles run past H, I, an expert's or a block's rows and past the
    tensors' ends (zeros): the pointer loads' bits, at both prefill tile sets."""
    if not supports_tma(torch.device("cuda")):
        pytest.skip("TMA descriptors need an NVIDIA GPU from Hopper on")
    shape = dict(experts=experts, hidden=hidden, inter=inter, topk=topk)
    case = make_case(tokens, torch.bfloat16, "cuda", seed=tokens + rows, **shape)
    tiles = experts_triton_grouped.default_tiles(rows, tma=True)._asdict()
    pointer = moe_experts_triton_grouped(*case, SiluAndMul(), **dict(tiles, tma=False))
    assert torch.equal(moe_experts_triton_grouped(*case, SiluAndMul(), **tiles), pointer)


@pytest.mark.gpu
@pytest.mark.parametrize("tail", [16, 32, 64])
@pytest.mark.parametrize("tma", [True, False], ids=["tma", "ptr"])
def test_triton_grouped_tail_tiles_on_gpu(tail, tma):
    """The 128-row prefill tiles with each expert's last block of at most `tail` rows on smaller
    tiles (MMAv2 below 64 rows, wgmma from 64 on sm_90): the full tiles' bits, and within the
    bf16 bound of the fp64 loop."""
    if tma and not supports_tma(torch.device("cuda")):
        pytest.skip("TMA descriptors need an NVIDIA GPU from Hopper on")
    case = make_case(4096, torch.bfloat16, "cuda", seed=tail, **dict(KIMI_LINEAR, experts=257))
    tiles = experts_triton_grouped.default_tiles(LARGE_PREFILL_TILES_FROM_ROWS, tma=tma)._asdict()
    full = moe_experts_triton_grouped(*case, SiluAndMul(), **dict(tiles, tail_block_m=0))
    out = moe_experts_triton_grouped(*case, SiluAndMul(), **dict(tiles, tail_block_m=tail))
    assert torch.equal(out, full)
    expected = _fp64_loop(case)
    assert (out.double() - expected).abs().max() <= 4 * 2**-8 * expected.abs().max()


@pytest.mark.gpu
@pytest.mark.parametrize("tokens", [32, 256])
def test_triton_grouped_kimi_linear_fp32_on_gpu(tokens):
    case = make_case(tokens, torch.float32, "cuda", seed=tokens, **dict(KIMI_LINEAR, experts=16))
    out = moe_experts_triton_grouped(*case, SiluAndMul())
    # IEEE fp32 dots (no TF32): within fp32 rounding of the fp64 loop over length-2304 sums.
    torch.testing.assert_close(out.double(), _fp64_loop(case), rtol=1e-5, atol=1e-5)


@pytest.mark.gpu
@pytest.mark.parametrize("tokens", [32, 64, 256])
def test_triton_grouped_graph_replay_equals_eager(tokens):
    case = make_case(tokens, torch.bfloat16, "cuda", seed=tokens, **KIMI_LINEAR)
    # Captured on other activations and routing, so the replay must read what is copied in.
    other = make_case(tokens, torch.bfloat16, "cuda", seed=tokens + 1, **KIMI_LINEAR)
    x, w13, w2, w, ids = case
    static = [other[0], other[3], other[4]]

    def call(x, w, ids):
        return moe_experts_triton_grouped(x, w13, w2, w, ids, SiluAndMul())

    call(x, w, ids)  # compile outside the checked region
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        eager = call(x, w, ids)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        call(*static)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = call(*static)
    for buf, new in zip(static, (x, w, ids), strict=True):
        buf.copy_(new)
    captured.zero_()
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(captured, eager)


@pytest.mark.gpu
@pytest.mark.parametrize("block_m", [16, 32])
def test_group_rows_on_gpu_eager_and_graph_replay(block_m):
    # Kimi-Linear's 256 routed experts plus a fused shared expert (id 256), top-8 + shared: 9
    # slots; 1-4096 tokens (decode batches and prefill chunks, several steps of the kernel), then
    # prefills past GROUP_KERNEL_MAX_ROWS (the chunked kernels, the last chunk partial).
    experts, slots = 257, 9
    gen = torch.Generator(device="cuda").manual_seed(block_m)
    for tokens in (1, 2, 7, 16, 64, 113, 256, 512, 1024, 2048, 4096, 8192, 16000):
        routed = torch.rand(tokens, experts - 1, generator=gen, device="cuda").topk(slots - 1)[1]
        shared = torch.full((tokens, 1), experts - 1, device="cuda")
        ids = torch.cat([routed, shared], dim=1)
        expected = group_rows_reference(ids, experts, block_m)
        eager = group_rows(ids, experts, block_m)
        for name, a, b in zip(eager._fields, eager, expected, strict=True):
            assert torch.equal(a, b), (tokens, name)
        # Captured on other routing (int32, some of it out of range): the replay reads the ids.
        static = torch.randint(-1, experts + 1, ids.shape, generator=gen, device="cuda").int()
        group_rows(static, experts, block_m)  # compile outside the capture
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            captured = group_rows(static, experts, block_m)
        for ids_now in (static.clone(), ids.int()):
            static.copy_(ids_now)
            for t in captured:
                t.fill_(-7)
            graph.replay()
            torch.cuda.synchronize()
            reference = group_rows_reference(ids_now, experts, block_m)
            for name, a, b in zip(captured._fields, captured, reference, strict=True):
                assert torch.equal(a, b), (tokens, name, "replay")


def test_routing_params_reject_bad_groups():
    with pytest.raises(ValueError, match="top_k 17"):
        RoutingParams(E, 17)
    with pytest.raises(ValueError, match="top_k 0"):
        RoutingParams(E, 0)
    with pytest.raises(ValueError, match="num_expert_group 3"):
        RoutingParams(E, 2, num_expert_group=3, topk_group=1)
    with pytest.raises(ValueError, match="num_expert_group must be >= 1, got 0"):
        RoutingParams(E, 2, num_expert_group=0)
    with pytest.raises(ValueError, match="topk_group 5"):
        RoutingParams(E, 2, num_expert_group=4, topk_group=5)
    with pytest.raises(ValueError, match="top_k 9 exceeds the 8 experts of the 2 kept groups"):
        RoutingParams(E, 9, num_expert_group=4, topk_group=2)
    assert RoutingParams(E, 2, topk_group=99).topk_group == 99  # unused without groups


def test_routing_params_reject_counts_that_are_not_ints_and_a_non_finite_scale():
    # A float group count would reach the kernels as a float constexpr.
    with pytest.raises(TypeError, match="num_expert_group must be an int, got 2.0"):
        RoutingParams(E, 2, num_expert_group=2.0)
    with pytest.raises(TypeError, match="top_k must be an int, got True"):
        RoutingParams(E, True)
    with pytest.raises(ValueError, match="routed_scaling_factor must be finite, got inf"):
        RoutingParams(E, 2, routed_scaling_factor=float("inf"))


def test_routing_params_are_a_frozen_value():
    routing = RoutingParams(E, K, routed_scaling_factor=2.5, num_fused_shared_experts=1)
    assert routing.columns == K + 1
    assert routing == RoutingParams(E, K, routed_scaling_factor=2.5, num_fused_shared_experts=1)
    assert hash(routing) == hash(replace(routing))
    assert routing != replace(routing, renormalize=False)
    with pytest.raises(AttributeError):
        routing.top_k = 2
    with pytest.raises(TypeError):
        RoutingParams(E, K, 1)  # the grouping and the rest by keyword only


def test_router_runs_without_tensor_values():
    logits = torch.empty(3, E, device="meta")
    bias = torch.empty(E, device="meta")
    weights, ids = grouped_topk(logits, bias, RoutingParams(E, K, num_expert_group=4, topk_group=2))
    assert weights.shape == ids.shape == (3, K) and ids.dtype == torch.int64


def test_router_rejects_bad_arguments():
    logits, routing = torch.zeros(2, E), RoutingParams(E, 2)
    with pytest.raises(ValueError, match="scoring_func 'relu'"):
        RoutingParams(E, 2, scoring_func="relu")
    with pytest.raises(ValueError, match=r"router_logits must be \[T, E\]"):
        grouped_topk(torch.zeros(E), None, routing)
    with pytest.raises(ValueError, match="router_logits dtype torch.int64"):
        grouped_topk(torch.zeros(2, E, dtype=torch.int64), None, routing)
    with pytest.raises(ValueError, match="router_logits has 17 experts, routing.num_experts is 16"):
        grouped_topk(torch.zeros(2, E + 1), None, routing)
    with pytest.raises(ValueError, match=r"e_score_correction_bias must be \[E=16\]"):
        grouped_topk(logits, torch.zeros(E + 1), routing)
    with pytest.raises(ValueError, match="e_score_correction_bias must be floating point"):
        grouped_topk(logits, torch.zeros(E, dtype=torch.int32), routing)
    with pytest.raises(ValueError, match="e_score_correction_bias is on meta"):
        grouped_topk(logits, torch.zeros(E, device="meta"), routing)
    with pytest.raises(ValueError, match="num_warps must be a positive power of two"):
        grouped_topk_triton(logits.to(DEVICE), None, routing, num_warps=3)


# ---------------------------------------------------------------------------------------------
# The router's Triton kernel against its torch reference (interpreter on CPU, native on a GPU)
# ---------------------------------------------------------------------------------------------

# Kimi-Linear-48B-A3B's router (tests/transformers_utils/test_kimi_configs.py, KIMI_LINEAR_48B).
KIMI_LINEAR_ROUTER = RoutingParams(256, 8, routed_scaling_factor=2.446)
# Weights: a few fp32 ulps (sigmoid / exp, and the order of the renormalising or softmax sums).
ROUTER_ULPS = dict(rtol=8 * 2**-23, atol=0.0)


def router_inputs(tokens, experts, seed, device=DEVICE, dtype=torch.float32):
    # DEVICE: the interpreter's CPU tensors in unmarked tests, the GPU in `gpu` tests. Drawn on
    # the CPU, so that the seeds chosen for tie-free data give the same data on both.
    gen = torch.Generator().manual_seed(seed)
    logits = torch.randn(tokens, experts, generator=gen).to(dtype)
    bias = torch.randn(experts, generator=gen) * 0.1
    return logits.to(device), bias.to(device)


def decision_gap(logits, bias, top_k, groups=1, topk_group=1, scoring_func="sigmoid"):
    """The smallest fp64 gap between values whose order decides the selection (the top
    `topk_group + 1` group scores, the top `top_k + 1` biased scores of the kept experts): data
    is tie-free for the comparison when it is far above fp32 ulps."""
    x = logits.double().cpu()
    scores = x.sigmoid() if scoring_func == "sigmoid" else x.softmax(-1)
    choice = scores if bias is None else scores + bias.double().cpu()
    tokens, experts = choice.shape
    gaps = []
    if groups > 1:
        grouped = choice.view(tokens, groups, experts // groups)
        group_scores = grouped.topk(2, -1)[0].sum(-1)
        ranked = group_scores.topk(min(topk_group + 1, groups), -1)[0]
        gaps.append((ranked[:, :-1] - ranked[:, 1:]).min())
        keep = torch.zeros_like(group_scores, dtype=torch.bool)
        keep.scatter_(1, group_scores.topk(topk_group, -1)[1], True)
        choice = grouped.masked_fill(~keep[..., None], float("-inf")).view(tokens, experts)
    kept = experts // groups * topk_group
    ranked = choice.topk(min(top_k + 1, kept), -1)[0]
    gaps.append((ranked[:, :-1] - ranked[:, 1:]).min())
    return min(float(g) for g in gaps)


def assert_router_matches_reference(logits, bias, routing, launches=None):
    """Kernel vs reference on tie-free data: identical ids, weights within fp32 ulps. Returns
    both outputs, kernel's first, for further checks without a second launch."""
    if logits.shape[0]:
        gap = decision_gap(logits, bias, routing.top_k, routing.num_expert_group,
                           routing.topk_group, routing.scoring_func)  # fmt: skip
        assert gap > 1e-5, f"test data is not tie-free (gap {gap:.3g}): pick another seed"
    weights, ids = grouped_topk_triton(logits, bias, routing)
    ref_weights, ref_ids = grouped_topk_ref(logits, bias, routing)
    assert ids.dtype == ref_ids.dtype == torch.int64 and weights.dtype == torch.float32
    assert torch.equal(ids, ref_ids)
    torch.testing.assert_close(weights, ref_weights, **ROUTER_ULPS)
    if launches is not None:
        assert launches["_grouped_topk_kernel"] == 1
    return (weights, ids), (ref_weights, ref_ids)


@pytest.mark.parametrize("tokens", [1, 3, 17])
@pytest.mark.parametrize("groups,topk_group", [(1, 1), (4, 2)])
@pytest.mark.parametrize("renormalize", [True, False])
@pytest.mark.parametrize("with_bias", [True, False])
@pytest.mark.parametrize("scoring_func", ["sigmoid", "softmax"])
def test_router_kernel_matches_reference(
    scoring_func, with_bias, renormalize, groups, topk_group, tokens, triton_launches
):
    logits, bias = router_inputs(tokens, E, seed=tokens)
    routing = RoutingParams(
        E, K, num_expert_group=groups, topk_group=topk_group, renormalize=renormalize,
        routed_scaling_factor=2.5, scoring_func=scoring_func,
    )  # fmt: skip
    assert_router_matches_reference(logits, bias if with_bias else None, routing, triton_launches)


def test_router_kernel_kimi_linear_config(triton_launches):
    logits, bias = router_inputs(5, 256, seed=0)
    assert_router_matches_reference(logits, bias, KIMI_LINEAR_ROUTER, triton_launches)


@pytest.mark.parametrize(
    "routing",
    [
        RoutingParams(256, 8, num_expert_group=8, topk_group=4),  # DeepSeek-V3's grouping
        RoutingParams(20, 3, num_expert_group=4, topk_group=2),  # groups of 5: padded lanes
        RoutingParams(24, 6, num_expert_group=3, topk_group=2, scoring_func="softmax"),
        RoutingParams(896, 16),  # Kimi-K3: 896 experts in 1024 lanes
        RoutingParams(16, 1),  # one key kept: Triton 3.6's tl.topk fails at k = 1
    ],
)
def test_router_kernel_other_shapes(routing, triton_launches):
    logits, bias = router_inputs(2, routing.num_experts, seed=routing.num_experts)
    assert_router_matches_reference(logits, bias, routing, triton_launches)


def test_router_kernel_reads_bf16_and_strided_logits(triton_launches):
    wide, bias = router_inputs(3, 2 * E, seed=4, dtype=torch.bfloat16)
    logits = wide[:, ::2]  # strided view, bf16: read in place and widened in the kernel
    assert_router_matches_reference(
        logits, bias[::2], RoutingParams(E, K, routed_scaling_factor=2.5)
    )
    assert triton_launches["_grouped_topk_kernel"] == 1


def test_router_kernel_zero_tokens(triton_launches):
    weights, ids = grouped_topk_triton(
        torch.zeros(0, E, device=DEVICE), torch.zeros(E, device=DEVICE), RoutingParams(E, K)
    )
    assert weights.shape == ids.shape == (0, K)
    assert (weights.dtype, ids.dtype) == (torch.float32, torch.int64)
    assert triton_launches["_grouped_topk_kernel"] == 0


def test_router_kernel_ties_go_to_the_lowest_index():
    # All experts equal: the kernel's documented rule picks experts 0, 1, ... (and groups 0, 1).
    logits = torch.zeros(2, E, device=DEVICE)
    _, ids = grouped_topk_triton(logits, None, RoutingParams(E, K))
    assert ids.tolist() == [list(range(K))] * 2
    bias = torch.zeros(E, device=DEVICE)
    bias[12:] = 1.0  # group 3 is kept first; groups 0, 1 and 2 tie for the second place
    _, ids = grouped_topk_triton(
        logits, bias, RoutingParams(E, 6, num_expert_group=4, topk_group=2)
    )
    assert ids.tolist() == [[12, 13, 14, 15, 0, 1]] * 2


def tied_router_inputs(tokens, experts, seed, device=DEVICE):
    """Logits in {-2, -1, 0} plus five lanes at 3 per token, bias in {0, 0.25}: the top five
    biased scores of a token tie, and so do the dozens after them, across the top-k boundary.
    The distinct values (sigmoid of the logit plus the bias) are >= 0.05 apart."""
    gen = torch.Generator().manual_seed(seed)
    logits = torch.randint(-2, 1, (tokens, experts), generator=gen).float()
    for t in range(tokens):
        logits[t, torch.randperm(experts, generator=gen)[:5]] = 3.0
    bias = torch.randint(0, 2, (experts,), generator=gen).float() * 0.25
    return logits.to(device), bias.to(device)


def assert_ties_go_to_the_lowest_index(logits, bias, routing):
    """Ids exactly those of a stable descending sort of the biased scores (equal scores keep
    index order), weights within ulps of the reference's formula on those ids."""
    top_k, shared = routing.top_k, routing.num_fused_shared_experts
    scores = logits.float().cpu().sigmoid()
    order = (scores + bias.cpu()).sort(dim=-1, descending=True, stable=True)[1][:, :top_k]
    weights, ids = grouped_topk_triton(logits, bias, routing)
    assert torch.equal(ids[:, :top_k].cpu(), order)
    expected = scores.gather(1, order)
    expected = expected / (expected.sum(-1, keepdim=True) + 1e-20) * routing.routed_scaling_factor
    torch.testing.assert_close(weights[:, :top_k].cpu(), expected, **ROUTER_ULPS)
    experts = logits.shape[1]
    assert ids[:, top_k:].tolist() == [list(range(experts, experts + shared))] * len(ids)
    assert bool((weights[:, top_k:] == 1.0).all())


@pytest.mark.parametrize("shared", [0, 1])
def test_router_kernel_many_ties_across_the_top_k_boundary(shared, triton_launches):
    logits, bias = tied_router_inputs(6, 256, seed=shared)
    routing = replace(KIMI_LINEAR_ROUTER, num_fused_shared_experts=shared)  # top-8 (+ 1) of 256
    assert_ties_go_to_the_lowest_index(logits, bias, routing)
    assert triton_launches["_grouped_topk_kernel"] == 1


def test_router_kernel_takes_every_expert_with_more_slots_than_experts():
    # top-16 + 1 shared of 16 experts: 17 slots, more than the 16 experts' lanes.
    logits, bias = router_inputs(2, E, seed=3)
    routing = RoutingParams(E, E, num_fused_shared_experts=1, routed_scaling_factor=2.5)
    assert_router_matches_reference(logits, bias, routing)


@pytest.mark.parametrize("groups,topk_group", [(1, 1), (4, 2)])
def test_router_kernel_nan_gives_distinct_in_range_ids(groups, topk_group):
    # 20 experts in 32 lanes: the padded lanes must never be chosen, whatever the NaN's sign.
    logits, bias = router_inputs(4, 20, seed=7)
    logits[0, 3] = float("nan")
    logits[1, :] = float("nan")
    bias[5] = float("nan")
    bias[::2] = -float("nan")  # sign bit set: its key is below -inf's
    routing = RoutingParams(20, 6, num_expert_group=groups, topk_group=topk_group,
                            num_fused_shared_experts=1)  # fmt: skip
    _, ids = grouped_topk_triton(logits, bias, routing)
    routed = ids[:, :6].cpu()
    assert bool(((routed >= 0) & (routed < 20)).all())
    assert all(len(set(row)) == 6 for row in routed.tolist())
    assert ids[:, 6].tolist() == [20] * 4
    every = torch.full_like(bias, -float("nan"))  # every biased score a negative NaN
    _, ids = grouped_topk_triton(logits, every, routing)
    routed = ids[:, :6].cpu()
    assert bool(((routed >= 0) & (routed < 20)).all())
    assert all(len(set(row)) == 6 for row in routed.tolist())


@pytest.mark.gpu
def test_router_kernel_ties_and_nan_on_gpu():
    logits, bias = tied_router_inputs(64, 256, seed=2, device="cuda")
    assert_ties_go_to_the_lowest_index(
        logits, bias, replace(KIMI_LINEAR_ROUTER, num_fused_shared_experts=1)
    )
    logits[:, ::3] = float("nan")
    _, ids = grouped_topk_triton(logits, torch.full_like(bias, -float("nan")), KIMI_LINEAR_ROUTER)
    assert bool(((ids >= 0) & (ids < 256)).all())
    assert bool((ids.sort(-1)[0].diff(dim=-1) > 0).all())


def test_grouped_topk_dispatches_with_use_triton(triton_launches, monkeypatch):
    logits, bias = router_inputs(3, E, seed=5)
    grouped_topk(logits, bias, RoutingParams(E, K))
    assert triton_launches["_grouped_topk_kernel"] == 1
    monkeypatch.setenv("TRITON_INTERPRET", "0")  # CPU tensors now take the torch reference
    grouped_topk(logits.cpu(), bias.cpu(), RoutingParams(E, K))
    assert triton_launches["_grouped_topk_kernel"] == 1


@pytest.mark.gpu
@pytest.mark.parametrize("tokens", [1, 64, 256])
def test_router_kernel_on_gpu(tokens, triton_launches):
    logits, bias = router_inputs(tokens, 256, seed=tokens, device="cuda")
    assert_router_matches_reference(logits, bias, KIMI_LINEAR_ROUTER, triton_launches)


@pytest.mark.gpu
def test_router_kernel_replays_in_a_cuda_graph():
    logits, bias = router_inputs(64, 256, seed=1, device="cuda")
    static = logits.clone()
    grouped_topk(static, bias, KIMI_LINEAR_ROUTER)  # compile outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        weights, ids = grouped_topk(static, bias, KIMI_LINEAR_ROUTER)
    static.copy_(logits.flip(0))
    graph.replay()
    ref_weights, ref_ids = grouped_topk_ref(logits.flip(0), bias, KIMI_LINEAR_ROUTER)
    assert torch.equal(ids, ref_ids)
    torch.testing.assert_close(weights, ref_weights, **ROUTER_ULPS)


# ---------------------------------------------------------------------------------------------
# Fused shared experts: the router's appended columns, K > 8 slots in the GEMV path, E + S experts
# ---------------------------------------------------------------------------------------------


GROUPED_ROUTER = RoutingParams(E, K, num_expert_group=4, topk_group=2, routed_scaling_factor=2.5)


@pytest.mark.parametrize(
    "routing,shared",
    [(GROUPED_ROUTER, 1), (GROUPED_ROUTER, 2),  # one and several shared columns
     (KIMI_LINEAR_ROUTER, 1)],  # top-8 + 1: the kernel's slot block pads to 16
    ids=["16-grouped-1", "16-grouped-2", "256-1"],
)  # fmt: skip
def test_router_appends_fused_shared_expert_columns(routing, shared, triton_launches):
    experts = routing.num_experts
    logits, bias = router_inputs(5, experts, seed=0)  # tie-free at both sizes
    routing = replace(routing, num_fused_shared_experts=shared)
    # The kernel's and the reference's outputs, each checked on its own below.
    for weights, ids in assert_router_matches_reference(logits, bias, routing, triton_launches):
        top_k = routing.top_k
        assert ids.shape == weights.shape == (5, top_k + shared)
        shared_ids = torch.arange(experts, experts + shared, device=DEVICE).expand(5, -1)
        assert torch.equal(ids[:, top_k:], shared_ids)
        assert torch.equal(weights[:, top_k:], torch.ones(5, shared, device=DEVICE))
        assert bool((ids[:, :top_k] < experts).all())
    with pytest.raises(ValueError, match="num_fused_shared_experts must be >= 0"):
        RoutingParams(experts, 2, num_fused_shared_experts=-1)


# Slots unrolled, not padded to 16 / 32. The slot count and the dtype are independent constexprs
# of one kernel body (the dtype sets only the rounding points, which test_triton_matches_loop
# covers in both): each count runs in one dtype, and each dtype with one count.
@pytest.mark.parametrize(
    "topk,dtype", [(9, torch.float32), (17, torch.bfloat16)], ids=["9-fp32", "17-bf16"]
)
def test_triton_more_than_eight_slots_matches_loop(topk, dtype, triton_launches):
    shape = dict(experts=20, hidden=64, inter=32, topk=topk)
    x, w13, w2, w, ids = make_case(3, dtype, DEVICE, seed=topk, **shape)
    expected = moe_experts_loop(x, w13, w2, w, ids, SiluAndMul())
    out = moe_experts_triton(x, w13, w2, w, ids, SiluAndMul(), **WIDE_BLOCKS)
    assert_close_to_loop(out, expected)
    assert triton_launches["_moe_down_kernel"] == 1


def test_fused_moe_holds_and_loads_fused_shared_experts():
    layer = FusedMoE(E, H, INTER, SiluAndMul(), params_dtype=torch.float32,
                     num_fused_shared_experts=1)  # fmt: skip
    assert layer.num_experts == E and layer.w13_weight.shape[0] == layer.w2_weight.shape[0] == E + 1
    gen = torch.Generator().manual_seed(0)
    gate, up, down = (torch.randn(shape, generator=gen) for shape in
                      ((INTER, H), (INTER, H), (H, INTER)))  # fmt: skip
    for shard, tensor in (("w1", gate), ("w3", up), ("w2", down)):
        layer.weight_loader(tensor, E, shard)
    assert torch.equal(layer.w13_weight[E], torch.cat([gate, up]))
    assert torch.equal(layer.w2_weight[E], down)
    with pytest.raises(ValueError, match=f"expert {E + 1} out of range"):
        layer.weight_loader(gate, E + 1, "w1")
    with pytest.raises(ValueError, match="num_fused_shared_experts -1 < 0"):
        FusedMoE(E, H, INTER, SiluAndMul(), num_fused_shared_experts=-1)


def grouped_before_triton_glue(x, w13, w2, weights, ids):
    """`moe_experts_grouped` as it was before its glue became Triton launches (torch's SiluAndMul
    ops, a copy back to (token, slot) order, the fp32 sum over a [T, K, H] temporary); also
    returns y in sorted order and the inverse permutation, for the exact comparison."""
    k = ids.shape[1]
    sorted_ids, order = ids.reshape(-1).sort(stable=True)
    experts = torch.arange(w13.shape[0], device=x.device, dtype=sorted_ids.dtype)
    offs = torch.searchsorted(sorted_ids, experts, right=True, out_int32=True)
    h = torch._grouped_mm(x.index_select(0, order // k), w13.transpose(1, 2), offs=offs)
    y = torch._grouped_mm(silu_and_mul_ref(h), w2.transpose(1, 2), offs=offs)
    back = torch.empty_like(y).index_copy_(0, order, y)
    summed = back.view(*ids.shape, -1).float() * weights.float().unsqueeze(-1)
    inverse = torch.empty_like(order).scatter_(
        0, order, torch.arange(order.numel(), device=x.device)
    )
    return summed.sum(dim=1).to(x.dtype), y, inverse


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_grouped_glue_runs_the_triton_kernels(dtype, triton_launches):
    """Under the interpreter (or on a GPU) the grouped path's SiluAndMul and weighted sum are one
    launch each, and the sum reads the GEMM output through the inverse permutation."""
    x, w13, w2, w, ids = make_case(9, dtype, device=DEVICE, seed=3)
    out = moe_experts_grouped(x, w13, w2, w, ids, SiluAndMul())
    assert triton_launches["_silu_and_mul_kernel"] == 1
    assert triton_launches["_moe_weighted_sum_kernel"] == 1
    _, y, inverse = grouped_before_triton_glue(x, w13, w2, w, ids)
    # The same GEMMs on the same rows; the kernels' silu may differ from torch's by exp's ulps on
    # CPU (test_silu_and_mul.py), so compare with the loop's tolerance, and exactly on a GPU.
    expected = moe_weighted_sum_ref(y, w, dtype, inverse=inverse)
    if DEVICE == "cuda":
        assert torch.equal(out, expected)
    else:
        assert_close_to_loop(out, expected)


@pytest.mark.gpu
@pytest.mark.parametrize("tokens", [8192, 1000])
def test_grouped_prefill_matches_the_torch_glue_on_gpu(tokens):
    """Kimi-Linear's routed experts with the shared expert fused (E 257, top-8 + 1) at prefill
    sizes: bit for bit the fixed-order sum of the same GEMM outputs, and within one bf16 rounding
    of the previous torch glue (whose fp32 sum adds the K slots in another order)."""
    if not grouped_mm_is_sync_free(torch.device("cuda"), torch.bfloat16):
        pytest.skip("torch's grouped GEMM kernel needs sm90 / sm100")
    gen = torch.Generator(device="cuda").manual_seed(tokens)
    experts, hidden, inter, topk = 257, 2304, 1024, 8

    def randn(*size, scale):
        return (torch.randn(*size, generator=gen, device="cuda") * scale).to(torch.bfloat16)

    w13, w2 = (
        randn(experts, 2 * inter, hidden, scale=hidden**-0.5),
        randn(experts, hidden, inter, scale=inter**-0.5),
    )
    x = randn(tokens, hidden, scale=1.0)
    logits = torch.randn(tokens, experts - 1, generator=gen, device="cuda")
    bias = torch.randn(experts - 1, generator=gen, device="cuda") * 0.1
    w, ids = grouped_topk(
        logits, bias, RoutingParams(experts - 1, topk, num_fused_shared_experts=1)
    )
    assert ids.shape == (tokens, topk + 1)
    out = moe_experts_grouped(x, w13, w2, w, ids, SiluAndMul())
    before, y, inverse = grouped_before_triton_glue(x, w13, w2, w, ids)
    assert torch.equal(out, moe_weighted_sum_ref(y, w, torch.bfloat16, inverse=inverse))
    # Two fp32 sums of the same 9 products in different orders differ by a few fp32 ulps of the
    # sum of |products|; after the bf16 rounding an entry differs by one bf16 ulp at most, and
    # only where the fp32 sum lay that close to a rounding boundary (a tiny fraction). One bf16
    # ulp of v is 2**-7 * |v| at most (8 significant bits: ulp / |v| lies in (2**-8, 2**-7]).
    terms = (y.index_select(0, inverse).view(tokens, topk + 1, hidden).float().abs()
             * w.unsqueeze(-1)).sum(dim=1)  # fmt: skip
    diff = (out.float() - before.float()).abs()
    assert (diff <= before.float().abs() * 2**-7 + terms * 2**-20).all()
    assert (out != before).float().mean() < 1e-3


@pytest.mark.parametrize("impl", [moe_experts_triton, moe_experts_triton_grouped])
def test_triton_rounds_each_slot_before_the_weighted_sum(impl):
    """Exact integer GEMMs (any accumulation order) where the rounding points decide the answer:
    slot 0 gives y = 257 (bf16: 256), slot 1 gives y = 1, weights 1 and 1. Rounding each slot's
    y to bf16 before the fp32 sum, as the references do, gives 256 + 1 = 257 -> bf16 256; a kernel
    that summed the unrounded fp32 values would give 258."""
    hidden = inter = 16
    x = torch.zeros(1, hidden, dtype=torch.bfloat16, device=DEVICE)
    x[0, 0] = 1.0
    w13 = torch.zeros(2, 2 * inter, hidden, dtype=torch.bfloat16, device=DEVICE)
    w13[:, :2, 0] = 32.0  # gate 32 for columns 0 and 1: silu(32) == 32 in fp32
    w13[:, inter, 0] = 1.0  # up: a = [32, 1, 0, ...]
    w13[:, inter + 1, 0] = 1 / 32
    w2 = torch.zeros(2, hidden, inter, dtype=torch.bfloat16, device=DEVICE)
    w2[0, :, 0], w2[0, :, 1] = 8.0, 1.0  # y = 8 * 32 + 1 = 257
    w2[1, :, 1] = 1.0  # y = 1
    ids = torch.tensor([[0, 1]], device=DEVICE)
    weights = torch.ones(1, 2, device=DEVICE)
    expected = moe_experts_loop(x, w13, w2, weights, ids, SiluAndMul())
    assert torch.equal(expected, torch.full_like(x, 256.0))
    assert torch.equal(impl(x, w13, w2, weights, ids, SiluAndMul()), expected)
