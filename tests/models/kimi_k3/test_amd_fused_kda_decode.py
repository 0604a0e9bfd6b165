"""The fused KDA decode kernel (under TRITON_INTERPRET=1 on CPU) against the unfused ops it fuses,
with and without its gated-RMSNorm epilogue, and the states it updates in place; and the Kimi-K3
lower-bound gate of the whole layer against an independent reference (transformers' KDA with the
gate written out from the formula on CPU, fla-core's in-kernel gate on GPU)."""

import math

import pytest
import torch
from engine_harness import EngineHarness, SingleLayer

import vllm.models.kimi_k3.amd.ops.fused_kda_decode as decode_module
import vllm.models.kimi_k3.amd.ops.fused_kda_decode_config as config_module
from vllm.config.vllm import decode_batch_class
from vllm.model_executor.layers.quantization.utils.fp8_per_token import per_token_fp8_quant
from vllm.models.kimi_k3.amd.kda import KimiK3DeltaAttention
from vllm.models.kimi_k3.amd.ops.fused_kda_decode import (
    KdaDecodeConfig,
    LowRankProj,
    fused_kda_decode,
    fused_kda_decode_ref,
    kda_decode_config,
)
from vllm.triton_utils import num_sms

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def make_step(n, heads, d, width, dtype, seed):
    gen = torch.Generator().manual_seed(seed)

    def rnd(*shape, scale=1.0):
        return (torch.randn(*shape, generator=gen) * scale).to(DEVICE)

    slots = torch.randperm(n + 2, generator=gen)[:n].to(DEVICE)  # a few unused slots
    proj = rnd(n, 4 * heads * d + 8).to(dtype)  # q | k | v | gate, plus padding: strided views
    return dict(
        mixed_qkv=proj[:, : 3 * heads * d],
        conv_weight=rnd(3 * heads * d, width, scale=0.5),
        conv_state=rnd(n + 2, 3 * heads * d, width - 1).to(dtype),
        raw_g=rnd(n, heads * d),
        A_log=torch.log(torch.rand(heads, generator=gen) * 15 + 1).to(DEVICE),
        dt_bias=rnd(heads * d, scale=0.5),
        b=rnd(n, heads + 3)[:, :heads],
        ssm_state=rnd(n + 2, heads, d, d, scale=0.1),
        slots=slots,
        gate=proj[:, 3 * heads * d : 4 * heads * d].view(n, heads, d),
        norm_weight=(1 + 0.1 * rnd(d)).to(dtype),
    )


def clone(step):
    return {k: (v.clone() if k in ("conv_state", "ssm_state") else v) for k, v in step.items()}


def check_against_unfused(step, lower_bound, config, triton_launches):
    """Runs the kernel(s) and the unfused reference on copies of the states and compares;
    returns the kernel's output and its step (with the updated states)."""
    heads, d = step["ssm_state"].shape[1], step["ssm_state"].shape[-1]
    n, dtype = step["b"].shape[0], step["mixed_qkv"].dtype
    ref_step, got_step = clone(step), clone(step)
    ref = fused_kda_decode_ref(**ref_step, lower_bound=lower_bound, eps=1e-5)
    got = fused_kda_decode(**got_step, lower_bound=lower_bound, eps=1e-5, config=config)
    assert triton_launches["_fused_kda_decode_kernel"] == 1  # the kernel, not its reference
    split = (config or kda_decode_config(n, heads, d, 1)).block_v < d
    assert triton_launches["_kda_decode_epilogue_kernel"] == int(split)
    assert got.shape == (n, heads, d) and got.dtype == dtype
    # Same fp32 math up to the order of the K-reductions and the ulps of exp/sigmoid/rsqrt; the
    # output is rounded to `dtype` last (bf16: one rounding, 2^-8 relative).
    tol = 1e-5 if dtype == torch.float32 else 2**-7
    torch.testing.assert_close(got.float(), ref.float(), rtol=tol, atol=tol)
    torch.testing.assert_close(got_step["ssm_state"], ref_step["ssm_state"], rtol=1e-5, atol=1e-6)
    assert torch.equal(got_step["conv_state"], ref_step["conv_state"])  # a pure shift: exact
    untouched = torch.ones(step["ssm_state"].shape[0], dtype=torch.bool, device=DEVICE)
    untouched[step["slots"]] = False
    assert torch.equal(got_step["ssm_state"][untouched], step["ssm_state"][untouched])
    assert torch.equal(got_step["conv_state"][untouched], step["conv_state"][untouched])
    return got, got_step


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("lower_bound", [None, -5.0], ids=["softplus", "lower-bound"])
@pytest.mark.parametrize("norm", [True, False], ids=["norm", "no-norm"])
@pytest.mark.parametrize("heads,d", [(2, 32), (3, 64), (1, 128)])
def test_fused_decode_matches_unfused_ops(heads, d, norm, lower_bound, dtype, triton_launches):
    """The default launch (single kernel below D = 64, V-split from there)."""
    step = make_step(4, heads, d, 4, dtype, seed=heads * d)
    if not norm:
        step["gate"] = step["norm_weight"] = None
    check_against_unfused(step, lower_bound, None, triton_launches)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("norm", [True, False], ids=["norm", "no-norm"])
@pytest.mark.parametrize("d,block_v", [(16, 2), (16, 4), (16, 16), (32, 8), (32, 16), (32, 32)])
def test_every_launch_variant_matches_unfused_ops(d, block_v, norm, dtype, triton_launches):
    """Single kernel (block_v == D) and V-split variants of several widths, with and without the
    norm (which the split leaves to its epilogue kernel), conv width 3 and 4."""
    width = 3 if block_v % 4 else 4
    step = make_step(3, 2, d, width, dtype, seed=d + block_v)
    if not norm:
        step["gate"] = step["norm_weight"] = None
    config = KdaDecodeConfig(block_v=block_v, num_warps=2)
    check_against_unfused(step, -5.0, config, triton_launches)


def test_default_launch_is_the_batch_class_launch():
    # An eager decode (a mixed step's decode rows) takes the launch its class's graph was
    # captured with: one of its own (shift programs of 4 * 132 // n) was a Triton compile in
    # the step (H100, docs/performance.md, "Thirty-fifth run").
    for n in range(1, 600):
        for heads, d, sms in ((32, 128, 132), (12, 128, 78), (2, 32, 132)):
            assert kda_decode_config(n, heads, d, sms) == kda_decode_config(
                decode_batch_class(n), heads, d, sms
            ), (n, heads, d, sms)


def test_default_config_depends_on_shapes_only():
    sms = 132
    # D = 128: V-split in the widest of 64 and 32-column blocks that gives each SM a program, 16
    # if neither does (Kimi-Linear: 1 sequence 16 columns, 2 32, 4 64; Kimi-K3 TP8's 12 heads:
    # 1-2 sequences 16, 4 32, 8 64).
    widths = {heads: [kda_decode_config(n, heads, 128, sms).block_v for n in (1, 2, 3, 4, 8)]
              for heads in (32, 12)}  # fmt: skip
    assert widths == {32: [16, 32, 64, 64, 64], 12: [16, 16, 32, 32, 64]}
    assert kda_decode_config(1, 32, 128, sms) == KdaDecodeConfig(16, 4, 64, gate_proj=True)
    assert kda_decode_config(2, 32, 128, sms) == KdaDecodeConfig(32, 4, 64, gate_proj=True)
    assert kda_decode_config(5, 32, 128, sms) == KdaDecodeConfig(64, 4, 64, gate_proj=True)
    # On fewer SMs (an H100 PCIe's 114) 2 sequences fill them with 64-column blocks; 128 programs
    # on 128 SMs are enough.
    assert kda_decode_config(2, 32, 128, 114).block_v == 64
    assert kda_decode_config(2, 32, 128, 128).block_v == 64
    assert kda_decode_config(2, 32, 128, 129).block_v == 32
    # 9 sequences take the launch of their batch class, 16: 4 * 132 // 16 shift programs.
    assert kda_decode_config(9, 32, 128, sms) == KdaDecodeConfig(64, 4, 33, gate_proj=True)
    assert kda_decode_config(64, 32, 128, sms) == KdaDecodeConfig(64, 4, 8, evict_state=True)
    assert kda_decode_config(256, 12, 128, sms) == KdaDecodeConfig(64, 4, 3, gate_proj=False)
    # Small heads: one program per head.
    assert kda_decode_config(1, 2, 32, sms) == KdaDecodeConfig(32, 4, gate_proj=True)
    # The gate projections move into the kernel up to GATE_PROJ_MAX_BATCH sequences, any shape.
    most = config_module.GATE_PROJ_MAX_BATCH
    for heads, d in ((32, 128), (2, 32)):
        assert kda_decode_config(most, heads, d, sms).gate_proj
        assert not kda_decode_config(most + 1, heads, d, sms).gate_proj
    # The state is evicted first from EVICT_STATE_MIN_BATCH to EVICT_STATE_MAX_BATCH sequences
    # (batch classes: 57 sequences take the launch of 64).
    low, high = config_module.EVICT_STATE_MIN_BATCH, config_module.EVICT_STATE_MAX_BATCH
    for heads, d in ((32, 128), (2, 32)):
        evicts = [kda_decode_config(n, heads, d, sms).evict_state for n in range(1, 2 * high)]
        assert evicts == [low - 8 < n <= high for n in range(1, 2 * high)]


def test_default_shift_programs_shrink_with_the_batch():
    """One per q or k head row while the batch leaves SMs idle, down to one whole tile each
    (Kimi-Linear's 8192 q | k channels in 1024-channel tiles; Kimi-K3 TP8's 3072)."""
    sms = 132
    counts = [config_module.kda_epilogue_programs(n, 32, 128, sms) for n in (1, 8, 64, 256)]
    assert counts == [64, 64, 8, 8]
    assert config_module.kda_epilogue_programs(16, 32, 128, sms) == 33
    assert config_module.kda_epilogue_programs(256, 12, 128, sms) == 3
    assert config_module.kda_epilogue_programs(1, 1, 16, sms) == 2


@pytest.mark.parametrize("block_w", [2, 4, 8])
@pytest.mark.parametrize("channels", [32, 96, 6 * 128, 8192, 3072])
def test_epilogue_tiling_covers_every_channel_once(channels, block_w):
    for programs in (1, 2, 3, 5, 7, 8, 33, 64, 10_000):
        block_c, span, grid = config_module.kda_epilogue_tiling(channels, programs, block_w)
        assert block_c & (block_c - 1) == 0 and channels % block_c == 0
        assert block_c * block_w <= config_module._SHIFT_TILE
        assert span % block_c == 0
        assert 1 <= grid <= programs
        assert (grid - 1) * span < channels <= grid * span
    # Kimi-Linear: one 1024-channel tile per program from 8 programs up; a loop over 8 below.
    assert config_module.kda_epilogue_tiling(8192, 8, 4) == (1024, 1024, 8)
    assert config_module.kda_epilogue_tiling(8192, 1, 4) == (1024, 8192, 1)
    assert config_module.kda_epilogue_tiling(8192, 64, 4) == (128, 128, 64)


def test_gate_proj_tiling():
    """Whole ranks in the V-split up to a 16384-element tile, chunks otherwise (the single
    kernel, wider ranks), and never a projection tile as wide as the state tile."""
    tiling = config_module.gate_proj_tiling
    assert tiling(128, 128, 16) == tiling(128, 128, 64) == (128, True)  # Kimi-Linear's launches
    assert tiling(128, 128, 128) == (32, False)  # the single kernel: 4096-element chunks
    assert tiling(256, 128, 64) == (32, False)  # too wide to hold whole
    assert tiling(64, 128, 64) == (128, True) and tiling(16, 128, 16) == (32, True)
    assert tiling(32, 32, 32) == (16, False)  # the single kernel's chunk halved
    assert tiling(20, 16, 4) == (32, True) and tiling(0, 128, 16) == (1, True)


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # exp(1e4) in the interpreter's sigmoid
@pytest.mark.parametrize("norm", ["quant", "norm", "no-norm"])
def test_shift_program_counts_give_identical_results(norm, triton_launches):
    """3 heads of 16: 96 q | k channels in 32-channel tiles. 1 program loops over all three
    tiles, 2 take 64 and 32 channels (four and two head rows: 3 heads are no multiple of the
    2 heads a program holds), 3 one tile each, 6 one 16-channel row each, 100 one channel each
    (96 programs); every count matches the unfused ops, and all give the same bits. The norm-only
    and no-norm launches (shift programs from column 1, or from 0) take 1, 2 and 6: a loop, an
    uneven split and a narrow tile, without the 96 programs the interpreter pays for."""
    step = make_step(2, 3, 16, 4, torch.bfloat16, seed=11)  # two tokens: per-token offsets
    if norm == "no-norm":
        step["gate"] = step["norm_weight"] = None
    results = []
    for programs in (1, 2, 3, 6, 100) if norm == "quant" else (1, 2, 6):
        for name in triton_launches:
            triton_launches[name] = 0
        config = KdaDecodeConfig(block_v=4, num_warps=2, shift_programs=programs)
        if norm == "quant":
            codes, (out, out_step) = check_quantized_equals_quantized_output(
                step, config, triton_launches
            )
        else:
            codes, (out, out_step) = (), check_against_unfused(step, -5.0, config, triton_launches)
        results.append((*codes, out, out_step["conv_state"], out_step["ssm_state"]))
    for other in results[1:]:
        for a, b in zip(results[0], other, strict=True):
            assert torch.equal(a.view(torch.uint8), b.view(torch.uint8))


@pytest.mark.parametrize("block_v", [0, 3, 64])
def test_config_is_checked(block_v):
    step = make_step(2, 2, 32, 4, torch.float32, seed=0)
    with pytest.raises(ValueError, match="config.block_v"):
        fused_kda_decode(**step, lower_bound=None, config=KdaDecodeConfig(block_v, 2))


def _bad_inputs():
    step = make_step(3, 2, 16, 4, torch.float32, seed=0)
    # Read at unit stride, H or D entries of them: a strided view or a short tensor was read
    # wrong (past its end) without an error.
    yield "slots must have unit stride", dict(step, slots=step["slots"].repeat_interleave(2)[::2])
    yield "A_log must be a contiguous", dict(step, A_log=step["A_log"][:1])
    yield "A_log must be a contiguous", dict(step, A_log=step["A_log"].repeat_interleave(2)[::2])
    yield "norm_weight must be", dict(step, norm_weight=step["norm_weight"][:8])
    yield "norm_weight must be", dict(step, norm_weight=step["norm_weight"].repeat(2))
    # A conv window of another dtype was convolved unrounded (the reference rounds it to
    # mixed_qkv's dtype: output and window differed); a bf16 recurrent state ran in the kernel
    # and crashed the reference's index_put.
    yield (
        "conv_state must have mixed_qkv's dtype",
        dict(step, conv_state=step["conv_state"].to(torch.bfloat16)),
    )
    yield "ssm_state must be float32", dict(step, ssm_state=step["ssm_state"].to(torch.bfloat16))


_BAD_INPUTS = list(_bad_inputs())


@pytest.mark.parametrize(
    "match,step", _BAD_INPUTS, ids=[f"{i}-{match}" for i, (match, _) in enumerate(_BAD_INPUTS)]
)
def test_inputs_are_checked(match, step):
    with pytest.raises(ValueError, match=match):
        fused_kda_decode(**step, lower_bound=None, config=KdaDecodeConfig(16, 2))


@pytest.mark.parametrize("programs", [0, -1, 8.0, True])
def test_shift_programs_are_checked(programs):
    step = make_step(2, 2, 32, 4, torch.float32, seed=0)
    config = KdaDecodeConfig(16, 2, shift_programs=programs)
    with pytest.raises(ValueError, match="config.shift_programs"):
        fused_kda_decode(**step, lower_bound=None, config=config)


@pytest.mark.gpu
@pytest.mark.parametrize("block_v,num_warps", [(128, 8), (64, 4), (32, 4), (16, 2), (8, 1)])
def test_gpu_kimi_linear_sizes_every_variant(block_v, num_warps, triton_launches):
    """32 heads x 128 at batch 64: on the GPU the V blocks of a head run concurrently, which the
    interpreter (one program after another) cannot show; every one reads the q/k conv windows
    that only the epilogue kernel may shift."""
    step = make_step(64, 32, 128, 4, torch.bfloat16, seed=block_v)
    check_against_unfused(step, -5.0, KdaDecodeConfig(block_v, num_warps), triton_launches)


def assert_both_policies_give_the_same_bits(run) -> None:
    """`run(evict)` -> (output, conv_state, ssm_state) of one step on fresh copies; the eviction
    policy is a cache hint, so both policies must give the same bits."""
    default, evicting = run(False), run(True)
    for a, b in zip(default, evicting, strict=True):
        assert torch.equal(a, b)


@pytest.mark.parametrize("block_v", [8, 32])
def test_evicting_the_state_first_gives_the_same_bits(block_v, triton_launches):
    """In the V-split and the single kernel, checked against the unfused ops as well."""
    step = make_step(3, 2, 32, 4, torch.bfloat16, seed=5)

    def run(evict):
        for name in triton_launches:
            triton_launches[name] = 0
        config = KdaDecodeConfig(block_v=block_v, num_warps=2, evict_state=evict)
        out, out_step = check_against_unfused(step, -5.0, config, triton_launches)
        return out, out_step["conv_state"], out_step["ssm_state"]

    assert_both_policies_give_the_same_bits(run)


@pytest.mark.gpu
@pytest.mark.parametrize("n", [1, 64])
def test_gpu_evicting_the_state_first_gives_the_same_bits(n):
    """Kimi-Linear sizes on the GPU, where the policy reaches the compiled loads and stores."""
    step = make_step(n, 32, 128, 4, torch.bfloat16, seed=n)
    default = kda_decode_config(n, 32, 128, num_sms(torch.device("cuda")))

    def run(evict):
        run_step = clone(step)
        config = KdaDecodeConfig(default.block_v, default.num_warps, evict_state=evict)
        out = fused_kda_decode(**run_step, lower_bound=-5.0, config=config)
        return out, run_step["conv_state"], run_step["ssm_state"]

    assert_both_policies_give_the_same_bits(run)


@pytest.mark.gpu
@pytest.mark.parametrize("n", [8, 256])
def test_gpu_cuda_graph_replay_matches_eager(n):
    """The default launch (V-split with its fp32 scratch at these sizes; 64 and 8 shift
    programs a token) captured once: a replay gives the eager call's output and states, bit for
    bit."""
    step = make_step(n, 32, 128, 4, torch.bfloat16, seed=1)
    warm, graph_step, eager_step = clone(step), clone(step), clone(step)
    fused_kda_decode(**warm, lower_bound=-5.0)  # compile outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fused_kda_decode(**graph_step, lower_bound=-5.0)
    graph.replay()
    expected = fused_kda_decode(**eager_step, lower_bound=-5.0)
    torch.cuda.synchronize()
    assert torch.equal(out, expected)
    assert torch.equal(graph_step["ssm_state"], eager_step["ssm_state"])
    assert torch.equal(graph_step["conv_state"], eager_step["conv_state"])


# ---------------------------------------------------------------------------------------------
# The per-token FP8 epilogue: exactly per_token_fp8_quant of the model-dtype output
# ---------------------------------------------------------------------------------------------


def check_quantized_equals_quantized_output(step, config, triton_launches, quant_dtype=None):
    """`quantize=True` against per_token_fp8_quant(the bf16 output), bit for bit, and the same
    state updates; returns the codes and scales, and the bf16 output and its step."""
    n, heads, d = step["gate"].shape
    plain_step, quant_step = clone(step), clone(step)
    plain = fused_kda_decode(**plain_step, lower_bound=-5.0, config=config)
    ref_q, ref_scale = per_token_fp8_quant(plain.reshape(n, heads * d), quant_dtype)
    for name in triton_launches:
        triton_launches[name] = 0
    q, scale = fused_kda_decode(
        **quant_step, lower_bound=-5.0, config=config, quantize=True, quant_dtype=quant_dtype
    )
    split = (config or kda_decode_config(n, heads, d, 1)).block_v < d
    assert triton_launches["_fused_kda_decode_kernel"] == 1
    assert triton_launches["_kda_decode_epilogue_kernel"] == int(split)
    assert triton_launches["_per_token_fp8_quant_kernel"] == int(not split)
    assert q.shape == (n, heads * d) and q.dtype == ref_q.dtype
    assert scale.shape == (n, 1) and scale.dtype == torch.float32
    assert torch.equal(q.view(torch.uint8), ref_q.view(torch.uint8))
    assert torch.equal(scale, ref_scale)
    assert torch.equal(quant_step["ssm_state"], plain_step["ssm_state"])
    assert torch.equal(quant_step["conv_state"], plain_step["conv_state"])
    return (q, scale), (plain, plain_step)


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # exp(1e4) in the interpreter's sigmoid
@pytest.mark.parametrize("quant_dtype", [torch.float8_e4m3fn, torch.float8_e4m3fnuz], ids=str)
@pytest.mark.parametrize("tile", [4096, 32], ids=["one-chunk", "head-chunks"])
@pytest.mark.parametrize("n", [1, 3])
@pytest.mark.parametrize("heads,d,block_v", [(3, 16, 4), (4, 32, 16), (5, 16, 16)])
def test_quantized_epilogue_equals_quantizing_the_output(
    heads, d, block_v, n, tile, quant_dtype, monkeypatch, triton_launches
):  # fmt: skip
    """Token 0's gate zeroes its output (sigmoid(-1e4) = 0): the floor scale and zero codes.
    `tile` 32 norms the heads in chunks of 2 (the second padded for odd head counts); block_v
    == d is the single variant, which quantizes with per_token_fp8_quant."""
    monkeypatch.setattr(decode_module, "_EPILOGUE_TILE", tile)
    step = make_step(n, heads, d, 4, torch.bfloat16, seed=n * 10 + heads)
    step["gate"][0] = -1.0e4
    (q, scale), _ = check_quantized_equals_quantized_output(
        step, KdaDecodeConfig(block_v, num_warps=2), triton_launches, quant_dtype
    )
    min_scale = decode_module.fp8_quant_params(quant_dtype)[2]
    assert (q[0].float() == 0).all() and float(scale[0]) == pytest.approx(min_scale, rel=1e-7)
    if n > 1:
        assert (q[1:].float() != 0).any()


def test_quantize_needs_the_norm():
    step = make_step(2, 2, 32, 4, torch.float32, seed=0)
    step["gate"] = step["norm_weight"] = None
    with pytest.raises(ValueError, match="quantize needs the norm"):
        fused_kda_decode(**step, lower_bound=None, quantize=True)


@pytest.mark.gpu
@pytest.mark.parametrize("n", [1, 64, 256])
def test_gpu_quantized_epilogue_kimi_linear_sizes(n, triton_launches):
    """32 heads x 128 with the default launch (V-split: the quantization is in the epilogue)."""
    step = make_step(n, 32, 128, 4, torch.bfloat16, seed=n)
    step["gate"][0] = -1.0e4
    check_quantized_equals_quantized_output(step, None, triton_launches)


@pytest.mark.gpu
@pytest.mark.parametrize("n", [1, 8, 64, 256])
def test_gpu_shift_programs_kimi_linear_sizes(n, triton_launches):
    """32 heads x 128: the default launch and the epilogue with 1 (a loop over 8 tiles), 8
    (one 1024-channel tile each), 3 (three tiles, two in the last program) and 64 shift
    programs a token: each quantizes exactly its bf16 output, and all give the same bits and
    states; the default also matches the unfused ops. On the GPU the shift programs run
    concurrently with the token's norm program, which the interpreter cannot show."""
    step = make_step(n, 32, 128, 4, torch.bfloat16, seed=n + 5)
    step["gate"][0] = -1.0e4
    check_against_unfused(step, -5.0, None, triton_launches)
    default = kda_decode_config(n, 32, 128, num_sms(torch.device("cuda")))
    results = []
    for programs in (default.shift_programs, 1, 8, 3, 64):
        for name in triton_launches:
            triton_launches[name] = 0
        config = KdaDecodeConfig(default.block_v, default.num_warps, programs)
        (q, scale), (out, out_step) = check_quantized_equals_quantized_output(
            step, config, triton_launches
        )
        results.append((q, scale, out, out_step["conv_state"], out_step["ssm_state"]))
    for other in results[1:]:
        for a, b in zip(results[0], other, strict=True):
            assert torch.equal(a.view(torch.uint8), b.view(torch.uint8))


def test_norm_and_gate_go_together():
    step = make_step(2, 2, 32, 4, torch.float32, seed=0)
    step["gate"] = None
    with pytest.raises(ValueError, match="norm_weight and gate go together"):
        fused_kda_decode(**step, lower_bound=None)


# ---------------------------------------------------------------------------------------------
# The gate projections in the kernel (`LowRankProj`): the bits of the unfused call
# ---------------------------------------------------------------------------------------------


def low_rank(n, heads, d, rank, dtype, gen):
    """A `LowRankProj` for an `[n, heads * d]` output whose R-term dots are exact in fp32 in any
    order: `a` in steps of 1/8 within [-1, 1], the weight in steps of 2^-11 within [-1/8, 1/8]
    (at most 8 significant bits: exact in bf16), so every partial sum is a multiple of 2^-14 of
    magnitude <= R / 8: exact while R < 2^13. Kernel and reference then round the same sums to
    the model dtype; most need more bits than bf16 keeps, so that rounding is checked too. `a` is
    a column view of a wider buffer, as f_a and g_a are of the in_proj output."""
    a = (torch.randint(-8, 9, (n, rank + 7), generator=gen) / 8).to(dtype)
    # NaN beside the view: a kernel reading past R without its mask poisons its sums.
    a[:, :3] = a[:, rank + 3 :] = float("nan")
    a = a.to(DEVICE)
    weight = torch.randint(-256, 257, (heads * d, rank), generator=gen) / 2048
    return LowRankProj(a[:, 3 : rank + 3], weight.to(dtype).to(DEVICE))


def with_low_rank(step, rank, seed, raw_g=True, gate=True):
    n, heads, d = step["b"].shape[0], step["b"].shape[1], step["ssm_state"].shape[-1]
    gen = torch.Generator().manual_seed(seed)
    dtype = step["mixed_qkv"].dtype
    step = dict(step)
    if raw_g:
        step["raw_g"] = low_rank(n, heads, d, rank, dtype, gen)
    if gate:
        step["gate"] = low_rank(n, heads, d, rank, dtype, gen)
    return step


def as_tuple(out):
    return out if isinstance(out, tuple) else (out,)


def check_gate_proj_bits(step, config, triton_launches, **kwargs):
    """The op with `LowRankProj` inputs against the op fed their reference products (the layer's
    linears, exact here: see `low_rank`): the same outputs (codes and scales with quantize) and
    states, bit for bit, in one launch of the kernel (and, split, of the epilogue)."""
    n, heads, d = step["b"].shape[0], step["b"].shape[1], step["ssm_state"].shape[-1]
    fused_step, plain_step = clone(step), clone(step)
    for name in ("raw_g", "gate"):
        if isinstance(step[name], LowRankProj):
            plain_step[name] = step[name].reference()
    if isinstance(step["gate"], LowRankProj):
        plain_step["gate"] = plain_step["gate"].view(n, heads, d)
    for name in triton_launches:
        triton_launches[name] = 0
    got = fused_kda_decode(**fused_step, config=config, **kwargs)
    assert triton_launches["_fused_kda_decode_kernel"] == 1
    assert triton_launches["_kda_decode_epilogue_kernel"] == int(config.block_v < d)
    expected = fused_kda_decode(**plain_step, config=config, **kwargs)
    for a, b in zip(as_tuple(got), as_tuple(expected), strict=True):
        assert a.dtype == b.dtype and torch.equal(a.view(torch.uint8), b.view(torch.uint8))
    assert torch.equal(fused_step["ssm_state"], plain_step["ssm_state"])
    assert torch.equal(fused_step["conv_state"], plain_step["conv_state"])


BF16, FP32 = torch.bfloat16, torch.float32
# (tile, block_v, dtype, quantize, lower_bound): both variants (16: single, 4: V-split) with the
# model-dtype and the quantized output, both gate forms, fp32; then the single kernel's R in
# three chunks, and a V-split, which loads R whole whatever the tile.
GATE_PROJ_CASES = [
    *[(4096, 16, BF16, False, None), (4096, 16, BF16, True, -5.0), (4096, 16, FP32, False, -5.0)],
    *[(4096, 4, BF16, False, None), (4096, 4, BF16, True, -5.0), (4096, 4, FP32, False, -5.0)],
    *[(128, 16, BF16, False, -5.0), (128, 4, BF16, True, None)],
]


@pytest.mark.parametrize("tile,block_v,dtype,quantize,lower_bound", GATE_PROJ_CASES, ids=str)
def test_gate_proj_gives_the_unfused_bits(
    tile, block_v, dtype, quantize, lower_bound, monkeypatch, triton_launches
):  # fmt: skip
    """Both projections in the kernel, R = 20 (no power of two: the last chunk is masked). The
    single kernel takes R in one chunk of 32 or (tile 128 at D = 16) three of 8 and norms with
    its gate; the V-split loads R whole (the tile does not apply) and hands the gate to the
    epilogue through the gate buffer (and quantizes there)."""
    monkeypatch.setattr(config_module, "_PROJ_TILE", tile)
    step = with_low_rank(make_step(3, 2, 16, 4, dtype, seed=block_v), 20, seed=tile + block_v)
    kwargs = dict(quantize=True, quant_dtype=torch.float8_e4m3fn) if quantize else {}
    config = KdaDecodeConfig(block_v, num_warps=2)
    check_gate_proj_bits(step, config, triton_launches, lower_bound=lower_bound, **kwargs)


@pytest.mark.parametrize("which", ["raw_g", "gate", "raw_g-no-norm"])
def test_either_projection_alone_gives_the_unfused_bits(which, triton_launches):
    """raw_g alone is the full-rank-gate layer's form (its gate a view of the in_proj output)."""
    step = make_step(3, 2, 16, 4, torch.bfloat16, seed=5)
    if which == "raw_g-no-norm":
        step["gate"] = step["norm_weight"] = None
    step = with_low_rank(step, 16, seed=6, raw_g=which != "gate", gate=which == "gate")
    check_gate_proj_bits(step, KdaDecodeConfig(4, num_warps=2), triton_launches, lower_bound=-5.0)


@pytest.mark.parametrize("heads,d", [(2, 32), (3, 64)])
def test_gate_proj_matches_unfused_ops(heads, d, triton_launches):
    """The default launch against the reference, which takes `LowRankProj` too: the single
    kernel at both D under the interpreter (one SM); on the H200 the V-split at D = 64."""
    step = with_low_rank(make_step(4, heads, d, 4, torch.bfloat16, seed=d), d, seed=d)
    check_against_unfused(step, -5.0, None, triton_launches)


def test_gate_proj_is_checked():
    step = make_step(2, 2, 16, 4, torch.float32, seed=0)
    good = low_rank(2, 2, 16, 8, torch.float32, torch.Generator().manual_seed(0))
    bad = [
        (LowRankProj(good.a, good.weight[:, :7]), "share R"),
        (LowRankProj(good.a, good.weight[:31]), r"weight \[32, R\]"),
        (LowRankProj(good.a[:1], good.weight), r"a must be \[2, R\]"),
        (LowRankProj(good.a, good.weight.t().contiguous().t()), "unit stride on R"),
        (LowRankProj(good.a.double(), good.weight.double()), "must be torch.float32"),
    ]
    for proj, match in bad:
        for name in ("raw_g", "gate"):
            with pytest.raises(ValueError, match=f"^{name}: .*{match}"):
                fused_kda_decode(**dict(step, **{name: proj}), lower_bound=None)


@pytest.mark.gpu
@pytest.mark.parametrize("quantize", [False, True])
@pytest.mark.parametrize("variant", ["default", "single"])
@pytest.mark.parametrize("n", [1, 2, 4, 8, 64])
def test_gpu_gate_proj_kimi_linear_sizes(n, variant, quantize, triton_launches):
    """32 heads x 128, R = 128: the default launch (V-split in 16, 32 or 64-column blocks; on
    the GPU the epilogue reads the gate buffer the V blocks wrote in the launch before) and the
    single kernel, against the unfused call."""
    step = with_low_rank(make_step(n, 32, 128, 4, torch.bfloat16, seed=n), 128, seed=n)
    default = kda_decode_config(n, 32, 128, num_sms(torch.device("cuda")))
    config = default if variant == "default" else KdaDecodeConfig(128, 8)
    check_gate_proj_bits(step, config, triton_launches, lower_bound=-5.0, quantize=quantize)


# ---------------------------------------------------------------------------------------------
# Kimi-K3's lower-bound gate against an independent reference
# ---------------------------------------------------------------------------------------------


def lower_bound_gate_loop(raw, A_log, dt_bias, lower_bound, heads, d):  # noqa: N803
    """fla's Kimi-K3 gate written out per token, head and channel from the formula:
    g = lower_bound * sigmoid(exp(A_log[h]) * (g_raw + dt_bias))."""
    out = torch.empty(raw.shape[0], heads, d)
    for t in range(raw.shape[0]):
        for h in range(heads):
            rate = math.exp(float(A_log[h]))
            for c in range(d):
                x = float(raw[t, h * d + c]) + float(dt_bias[h * d + c])
                out[t, h, c] = lower_bound * (1.0 / (1.0 + math.exp(-rate * x)))
    return out


@pytest.mark.skipif(DEVICE != "cpu", reason="the per-token loop reference runs on CPU")
def test_lower_bound_gate_layer_matches_transformers_with_the_formula_gate(hf_kimi_linear):
    """The K3 layer (prefill through kda_gate, decode through the fused kernel) against
    transformers' KDA with its softplus gate replaced by the per-token formula loop."""
    hidden, heads, d, lower_bound = 64, 2, 32, -5.0
    cfg = hf_kimi_linear.KimiLinearConfig(
        hidden_size=hidden, num_hidden_layers=1, linear_num_heads=heads, linear_head_dim=d,
        hidden_act="silu", rms_norm_eps=1e-5, num_attention_heads=heads,
        num_key_value_heads=heads, linear_attn_config={"kda_layers": [1], "full_attn_layers": []},
    )  # fmt: skip
    torch.manual_seed(5)  # transformers' initializers draw from the global generator
    hf = hf_kimi_linear.KimiLinearDeltaAttention(cfg, 0).float()
    gate = hf.forget_gate
    gen = torch.Generator().manual_seed(5)
    with torch.no_grad():
        gate.A_log.copy_(torch.log(torch.empty_like(gate.A_log).uniform_(1, 16, generator=gen)))
        gate.dt_bias.copy_(torch.randn(gate.dt_bias.shape, generator=gen) * 0.5)
        hf.o_norm.weight.copy_(1 + 0.1 * torch.randn(hf.o_norm.weight.shape, generator=gen))

    def formula_gate(hidden_states):
        raw = gate.f_b_proj(gate.f_a_proj(hidden_states))[0]
        g = lower_bound_gate_loop(raw, gate.A_log.flatten(), gate.dt_bias, lower_bound, heads, d)
        return g.unsqueeze(0)

    gate.forward = formula_gate
    layer = KimiK3DeltaAttention(
        hidden, heads, d, full_rank_gate=False, gate_lower_bound=lower_bound, norm_eps=1e-5,
        params_dtype=torch.float32, prefix="l",
    )  # fmt: skip
    tensors = []
    for name, tensor in hf.state_dict().items():
        if name == "conv1d.weight":
            parts = zip("qkv", tensor.chunk(3), strict=True)
            tensors += [(f"{p}_conv1d.weight", t) for p, t in parts]
        else:
            tensors.append((name.removeprefix("forget_gate."), tensor))
    layer.load_weights(tensors)
    for module in layer.modules():  # unquantized linears: nothing to process, the walk as loaded
        if hasattr(module, "process_weights_after_loading"):
            module.process_weights_after_loading()

    gen = torch.Generator().manual_seed(6)
    lengths, steps = [5, 3], 2
    inputs = [torch.randn(n + steps, hidden, generator=gen) for n in lengths]
    harness = EngineHarness(SingleLayer(layer, torch.float32), num_kda_slots=3)

    with torch.no_grad():
        expected = [hf(x.unsqueeze(0)).squeeze(0) for x in inputs]
        x = torch.cat([x[:n] for x, n in zip(inputs, lengths, strict=True)])
        got = list(layer(x, harness.schedule({0: 5, 1: 3}).kda).split(lengths))
        for step in range(steps):
            x = torch.stack([x[n + step] for x, n in zip(inputs, lengths, strict=True)])
            out = layer(x, harness.schedule({0: 1, 1: 1}).kda)
            got = [torch.cat([g, out[i : i + 1]]) for i, g in enumerate(got)]
    # fp32 on both sides; they differ in summation order only (chunked vs per-token recurrence,
    # fused decode kernel): under 1e-4 relative, where dropping exp(A_log) moves the output ~1.
    for g, e in zip(got, expected, strict=True):
        assert float((g - e).norm() / e.norm()) < 1e-4


@pytest.mark.gpu
def test_gpu_lower_bound_gate_and_core_match_fla_in_kernel_gate():
    """kda_gate + kda_prefill (what the layer runs) against fla-core's chunk_kda computing the
    Kimi-K3 gate itself (use_gate_in_kernel with A_log, dt_bias, lower_bound)."""
    pytest.importorskip("fla")
    from fla.ops.kda import chunk_kda

    from vllm.models.kimi_k3.amd.ops.kda_core import kda_prefill
    from vllm.models.kimi_k3.amd.ops.kda_gate import kda_gate

    gen = torch.Generator().manual_seed(7)
    heads, d, lengths, lower_bound = 4, 64, [37, 70], -5.0
    t = sum(lengths)
    q, k, v = (torch.randn(t, heads, d, generator=gen).cuda() for _ in range(3))
    raw = torch.randn(t, heads * d, generator=gen).cuda()
    A_log = torch.log(torch.rand(heads, generator=gen) * 15 + 1).cuda()  # noqa: N806
    dt_bias = (torch.randn(heads * d, generator=gen) * 0.5).cuda()
    beta = torch.rand(t, heads, generator=gen).cuda()
    qsl = torch.tensor([0, lengths[0], t], device="cuda")
    state = torch.zeros(2, heads, d, d, device="cuda")
    g = kda_gate(raw, A_log, dt_bias, lower_bound)
    got = kda_prefill(q, k, v, g, beta, state, qsl, torch.tensor([0, 1], device="cuda"),
                      torch.tensor([False, False], device="cuda"))  # fmt: skip
    ref, ref_state = chunk_kda(
        q.unsqueeze(0), k.unsqueeze(0), v.unsqueeze(0), raw.view(1, t, heads, d),
        beta.unsqueeze(0), A_log=A_log, dt_bias=dt_bias, lower_bound=lower_bound,
        use_gate_in_kernel=True, use_qk_l2norm_in_kernel=True, output_final_state=True,
        cu_seqlens=qsl.long(),
    )  # fmt: skip
    # The same chunk kernel on both sides (TF32 dots): only the gate's ulps differ, far below
    # the O(1) change that dropping exp(A_log) makes.
    assert float((got - ref.squeeze(0)).norm() / ref.norm()) < 1e-2
    assert float((state - ref_state).norm() / ref_state.norm()) < 1e-2


def test_repeated_calls_on_the_same_buffers_each_run_a_step(triton_launches):
    """Decode reuses persistent buffers: a second call with the same tensor objects is a second
    step (it advances the states again and reads the new inputs), never a cached answer."""
    step = make_step(2, 2, 16, 4, torch.float32, seed=7)
    got_step, ref_step = clone(step), clone(step)
    for _ in range(2):
        ref = fused_kda_decode_ref(**ref_step, lower_bound=-5.0, eps=1e-5)
        got = fused_kda_decode(**got_step, lower_bound=-5.0, eps=1e-5)
        torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-5)
        got_step["mixed_qkv"].mul_(-0.5)  # new inputs in the same buffer (a view of proj)
        ref_step["mixed_qkv"].copy_(got_step["mixed_qkv"])
    assert triton_launches["_fused_kda_decode_kernel"] == 2
    torch.testing.assert_close(got_step["ssm_state"], ref_step["ssm_state"], rtol=1e-5, atol=1e-6)
    assert torch.equal(got_step["conv_state"], ref_step["conv_state"])
