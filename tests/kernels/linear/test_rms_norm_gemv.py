"""The input RMSNorm fused into the one-row GEMV after it (rms_norm_gemv.py): bit for bit the
norm kernel followed by `gemv` in the same tiles (under the interpreter on CPU, and on the GPU at
Kimi-Linear's KDA input projection, eagerly and replayed from a CUDA graph), its launch choice and
argument errors. The model's use of it: tests/models/kimi_k3/test_amd_kernel_dispatch.py."""

from dataclasses import replace

import pytest
import torch

import vllm.model_executor.kernels.linear.rms_norm_gemv as norm_gemv_mod
from vllm.model_executor.kernels.linear.gemv import gemv
from vllm.model_executor.kernels.linear.gemv_config import WIDE_TILE, GemvConfig, default_config
from vllm.model_executor.kernels.linear.rms_norm_gemv import (
    NORM_GEMV_MAX_HIDDEN,
    fused_add_rms_norm_gemv,
    fused_add_rms_norm_gemv_ref,
    norm_gemv_config,
    use_rms_norm_gemv,
)
from vllm.model_executor.layers.ops.rms_norm import fused_add_rms_norm, rms_norm, row_tile_warps
from vllm.triton_utils import next_power_of_2

# Kimi-Linear-48B's KDA input projection at TP 1: q | k | v | f_a | g_a | b of hidden 2304.
KDA_IN_PROJ = (12576, 2304)


def fitting_tile(hidden: int) -> GemvConfig:
    """`WIDE_TILE` under the norm kernel's warps for ``hidden``: a launch the op takes at any N."""
    return replace(WIDE_TILE, num_warps=row_tile_warps(next_power_of_2(hidden)))


def case(n: int, hidden: int, residual: bool, device: str, seed: int, dtype=torch.bfloat16):
    gen = torch.Generator(device=device).manual_seed(seed)
    x = torch.randn(1, hidden, generator=gen, device=device).to(dtype)
    res = torch.randn(1, hidden, generator=gen, device=device).to(dtype) if residual else None
    norm_w = (1 + 0.1 * torch.randn(hidden, generator=gen, device=device)).to(dtype)
    w = (torch.randn(n, hidden, generator=gen, device=device) * hidden**-0.5).to(dtype)
    return x, res, norm_w, w


def unfused(x, res, norm_w, eps, w, config):
    """The norm kernel, then `gemv` in ``config``: ``(out, new residual)``."""
    if res is None:
        h, new_res = rms_norm(x, norm_w, eps), x
    else:
        h, new_res = fused_add_rms_norm(x, res, norm_w, eps)
    return gemv(h, w, config=config), new_res


def assert_within_gemv_bound(out, h, w):
    """``out`` against the exact fp64 product of the normed row (gemv.py's bound)."""
    hd, wd = h.double(), w.double()
    exact, size = hd @ wd.t(), hd.abs() @ wd.abs().t()
    bound = 2**-8 * exact.abs() + (h.shape[1] + 3) * 2**-23 * size
    assert ((out.double() - exact).abs() <= bound).all()


# ---------------------------------------------------------------------------------------------
# The op under the interpreter (CPU): small shapes, tails in N and K
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("residual", [True, False])
@pytest.mark.parametrize(
    "n, hidden, dtype",
    [
        (48, 2304, torch.bfloat16),
        (40, 300, torch.bfloat16),
        (17, 256, torch.float16),
        (24, 257, torch.bfloat16),  # a one-column last K step
    ],
)
def test_equals_the_norm_then_gemv(triton_launches, residual, n, hidden, dtype):
    x, res, norm_w, w = case(n, hidden, residual, "cpu", seed=n, dtype=dtype)
    config = fitting_tile(hidden)
    out, new_res = fused_add_rms_norm_gemv(x, res, norm_w, 1e-6, w, config=config)
    assert triton_launches["_rms_norm_gemv_kernel"] == 1
    ref_out, ref_res = unfused(x, res, norm_w, 1e-6, w, config)
    assert out.shape == (1, n) and out.dtype == dtype
    assert torch.equal(out, ref_out) and torch.equal(new_res, ref_res)
    if residual:
        assert new_res.data_ptr() not in (x.data_ptr(), res.data_ptr())
    else:
        assert new_res is x
    h = rms_norm(ref_res, norm_w, 1e-6)
    assert_within_gemv_bound(out, h, w)
    torch.testing.assert_close(
        out, fused_add_rms_norm_gemv_ref(x, res, norm_w, 1e-6, w)[0], rtol=2**-7, atol=1e-2
    )


def test_cpu_without_interpreter_runs_the_reference(monkeypatch, triton_launches):
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    x, res, norm_w, w = case(24, 256, True, "cpu", seed=3)
    out, new_res = fused_add_rms_norm_gemv(x, res, norm_w, 1e-6, w, config=fitting_tile(256))
    assert triton_launches["_rms_norm_gemv_kernel"] == 0
    ref_out, ref_res = fused_add_rms_norm_gemv_ref(x, res, norm_w, 1e-6, w)
    assert torch.equal(out, ref_out) and torch.equal(new_res, ref_res)


def test_default_launch_is_the_gemvs_where_its_warps_are_the_norms():
    n, hidden = KDA_IN_PROJ
    assert norm_gemv_config(n, hidden) == default_config(1, n, hidden, 2)
    assert norm_gemv_config(n, hidden).num_warps == row_tile_warps(next_power_of_2(hidden))
    # MLA's q | kv_a (32 heads x 192 + 576) keeps its 4-warp default tiles: no fused launch.
    assert default_config(1, 6720, hidden, 2).num_warps == 4
    assert norm_gemv_config(6720, hidden) is None
    # Small weights take the default tiles too.
    assert norm_gemv_config(256, hidden) is None


def test_register_cap_only_on_nvidia(monkeypatch):
    """`WIDE_TILE`'s launch carries the register cap except on ROCm, whose Triton backend takes
    no such option (a direct call there would fail at launch)."""
    cap = {"maxnreg": norm_gemv_mod.MAX_REGISTERS}
    for rocm, expected in ((False, cap), (True, {})):
        monkeypatch.setattr(norm_gemv_mod.current_platform, "is_rocm", lambda rocm=rocm: rocm)
        norm_gemv_mod._spec.cache_clear()
        spec = norm_gemv_mod._spec(WIDE_TILE, 4096, True, True, False)
        assert {k: v for k, v in spec.kwargs.items() if k == "maxnreg"} == expected
    norm_gemv_mod._spec.cache_clear()


def test_cpu_rows_never_take_it():
    x, res, norm_w, w = case(64, 256, True, "cpu", seed=4)
    assert not use_rms_norm_gemv(x, res, norm_w, w)


def test_dispatch_takes_only_launches_the_op_makes(monkeypatch):
    """With the GEMV's dispatch faked to take CPU rows: the KDA projection's row takes the fused
    launch, and the op then accepts it; MLA's q | kv_a, the KDA projection's TP-2 shard, rows
    laid out unlike the model's and weights without a fused launch do not."""
    monkeypatch.setattr(norm_gemv_mod, "use_bf16_gemv", lambda x, w: True)
    n, hidden = KDA_IN_PROJ
    x, res, norm_w, w = case(n, hidden, True, "cpu", seed=7)
    assert use_rms_norm_gemv(x, res, norm_w, w) and use_rms_norm_gemv(x, None, norm_w, w)
    # What the op checks before it launches (the launch itself is too large to interpret).
    assert norm_gemv_mod._args_error(x, res, norm_w, w) == ""
    assert norm_gemv_config(n, hidden) is not None
    padded = torch.zeros(2, hidden + 8, dtype=x.dtype)
    rejected = {
        "MLA q | kv_a": (x, res, norm_w, w[:6720]),
        "TP 2 shard": (x, res, norm_w, w[: n // 2]),
        "row stride 2312 (16 does not divide it)": (padded[:1, :hidden], res, norm_w, w),
        "residual 8 bytes off": (x, padded[0, 4 : 4 + hidden][None], norm_w, w),
        "x 8 bytes off": (padded.view(-1)[4 : 4 + hidden][None], res, norm_w, w),
    }
    for name, args in rejected.items():
        assert not use_rms_norm_gemv(*args), name


def _bad(change: str):
    x, res, norm_w, w = case(32, 256, True, "cpu", seed=5)
    args = {"x": x, "residual": res, "norm_weight": norm_w, "weight": w}
    if change == "two rows":
        args["x"] = torch.cat([x, x])
    elif change == "fp32 x":
        args["x"] = x.float()
    elif change == "wide":
        args["x"] = torch.zeros(1, NORM_GEMV_MAX_HIDDEN + 1, dtype=torch.bfloat16)
    elif change == "weight dtype":
        args["weight"] = w.half()
    elif change == "weight K":
        args["weight"] = w[:, :128]
    elif change == "no channels":
        args["weight"] = w[:0]
    elif change == "residual shape":
        args["residual"] = torch.cat([res, res])
    elif change == "norm shape":
        args["norm_weight"] = norm_w[:128]
    elif change == "strided weight":
        args["weight"] = torch.zeros(256, 32, dtype=torch.bfloat16).t()
    elif change == "not a tensor":
        args["weight"] = w.tolist()
    return args


@pytest.mark.parametrize(
    "change, message",
    [
        ("two rows", "x must be a \\[1, H\\]"),
        ("fp32 x", "x must be a \\[1, H\\]"),
        ("wide", "H must be in"),
        ("weight dtype", "weight must be \\[N, 256\\]"),
        ("weight K", "weight must be \\[N, 256\\]"),
        ("no channels", "no output channels"),
        ("residual shape", "residual must match x"),
        ("norm shape", "norm_weight must be \\[256\\]"),
        ("strided weight", "unit stride on H"),
        ("not a tensor", "weight must be a torch.Tensor"),
    ],
)
def test_argument_errors(change, message):
    args = _bad(change)
    with pytest.raises(ValueError, match=message):
        fused_add_rms_norm_gemv(**args, eps=1e-6, config=fitting_tile(256))
    assert not use_rms_norm_gemv(**args)


@pytest.mark.parametrize(
    "config, message",
    [
        (None, "no fused launch for a \\[32, 256\\] weight"),
        (replace(WIDE_TILE, num_warps=4), "under the norm's 1 warps"),
        (replace(WIDE_TILE, num_warps=1, split_k=2), "one K split"),
        (GemvConfig(64, 128, num_warps=1, use_dot=True), "multiply-and-sum"),
        (GemvConfig(16, 96, num_warps=1), "power of two"),
    ],
)
def test_launch_errors(config, message):
    x, res, norm_w, w = case(32, 256, True, "cpu", seed=6)
    with pytest.raises(ValueError, match=message):
        fused_add_rms_norm_gemv(x, res, norm_w, 1e-6, w, config=config)


# ---------------------------------------------------------------------------------------------
# GPU: Kimi-Linear's KDA input projection, eager and from a CUDA graph
# ---------------------------------------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.parametrize("residual", [True, False])
def test_gpu_kda_in_proj_equals_the_norm_then_gemv(triton_launches, residual):
    # As the KDA layer launches it: the default launch.
    n, hidden = KDA_IN_PROJ
    x, res, norm_w, w = case(n, hidden, residual, "cuda", seed=11)
    assert use_rms_norm_gemv(x, res, norm_w, w)
    out, new_res = fused_add_rms_norm_gemv(x, res, norm_w, 1e-6, w)
    assert triton_launches["_rms_norm_gemv_kernel"] == 1
    ref_out, ref_res = unfused(x, res, norm_w, 1e-6, w, None)  # gemv's default: WIDE_TILE
    assert triton_launches["_gemv_kernel"] == 1 and triton_launches["_rms_norm_kernel"] == 1
    assert torch.equal(out, ref_out) and torch.equal(new_res, ref_res)
    assert_within_gemv_bound(out, rms_norm(ref_res, norm_w, 1e-6), w)


@pytest.mark.gpu
def test_gpu_cuda_graph_replay_equals_eager():
    # As the KDA layer launches it, right after a PDL kernel that writes its row: the replay
    # reads the new row.
    n, hidden = KDA_IN_PROJ
    src, res, norm_w, w = case(n, hidden, True, "cuda", seed=12)
    ones = torch.ones(hidden, dtype=src.dtype, device="cuda")

    def step():
        x = rms_norm(src, ones, 1e-6)
        return fused_add_rms_norm_gemv(x, res, norm_w, 1e-6, w)

    eager = step()
    step()  # compiled before the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = step()
    src2, res2 = case(n, hidden, True, "cuda", seed=13)[:2]
    src.copy_(src2)
    res.copy_(res2)
    graph.replay()
    expected = step()
    assert torch.equal(captured[0], expected[0]) and torch.equal(captured[1], expected[1])
    assert not torch.equal(captured[0], eager[0])
