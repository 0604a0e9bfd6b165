"""`router_logits`: the fp32 router logits of bf16 / fp32 hidden states, against exact fp64
products (bound of tests/kernels/linear/test_gemv.py's fp32 section: (K + 2) * 2^-24 *
sum_k |x_k w_k|), its dispatch by T, argument errors, and on a GPU Kimi's sizes and graph replay.
"""

import pytest
import torch
import torch.nn.functional as F

from vllm.model_executor.layers.fused_moe import router as router_mod
from vllm.model_executor.layers.fused_moe.router import router_logits, router_logits_ref


def case(t: int, e: int, h: int, device: str, seed: int, dtype=torch.bfloat16):
    gen = torch.Generator(device=device).manual_seed(seed)
    x = torch.randn(t, h, generator=gen, device=device).to(dtype)
    w = torch.randn(e, h, generator=gen, device=device) * h**-0.5
    return x, w


def assert_within_bound(out, x, w):
    xd, wd = x.double(), w.double()
    exact, size = xd @ wd.t(), xd.abs() @ wd.abs().t()
    assert out.dtype == torch.float32 and out.shape == exact.shape
    bound = (x.shape[1] + 2) * 2**-24 * size
    err = (out.double() - exact).abs()
    assert (err <= bound).all(), f"max excess {(err - bound).max().item():.3g}"


@pytest.mark.parametrize("t,e,h", [(1, 16, 64), (3, 64, 300), (17, 32, 136)])
def test_matches_exact(monkeypatch, triton_launches, t, e, h):
    # T = 17 takes the kernel's tl.dot configuration (above _FP32_DOT_MIN_M rows).
    monkeypatch.setattr(router_mod, "ROUTER_GEMV_MAX_T", 32)
    x, w = case(t, e, h, "cpu", seed=t)
    assert_within_bound(router_logits(x, w), x, w)
    assert triton_launches["_gemv_kernel"] == 1
    assert_within_bound(router_logits_ref(x, w), x, w)  # the bound holds for cuBLAS / MKL too


def test_dispatch_by_tokens(monkeypatch, triton_launches):
    monkeypatch.setattr(router_mod, "ROUTER_GEMV_MAX_T", 4)
    x, w = case(5, 16, 64, "cpu", seed=5)
    assert torch.equal(router_logits(x, w), F.linear(x.float(), w))  # above: the reference
    assert triton_launches["_gemv_kernel"] == 0
    router_logits(x[:4], w)
    router_logits(x.t().contiguous().t()[:4], w)  # x strided on H: the reference
    assert triton_launches["_gemv_kernel"] == 1
    assert router_logits(x[:0], w).shape == (0, 16)
    assert triton_launches["_gemv_kernel"] == 1


def test_cpu_without_interpreter_runs_the_reference(monkeypatch, triton_launches):
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    x, w = case(3, 16, 64, "cpu", seed=6)
    assert torch.equal(router_logits(x, w), F.linear(x.float(), w))
    assert triton_launches["_gemv_kernel"] == 0


@pytest.mark.parametrize(
    "change,message",
    [
        (lambda x, w: (x[0], w), r"x must be \[T, H\]"),
        (lambda x, w: (x, w[:, :8]), r"x must be \[T, H\]"),
        (lambda x, w: (x.to(torch.int32), w), "x dtype"),
        (lambda x, w: (x, w.bfloat16()), "gate_weight must be float32"),
        (lambda x, w: (x, w.to("meta")), "gate_weight on meta"),
    ],
)
def test_argument_errors(change, message):
    x, w = case(2, 16, 64, "cpu", seed=7)
    for fn in (router_logits, router_logits_ref):
        with pytest.raises(ValueError, match=message):
            fn(*change(x, w))


KIMI = dict(e=256, h=2304)


@pytest.mark.gpu
@pytest.mark.parametrize("t", [1, 8, 64, 256, 4096])
def test_gpu_kimi_sizes(triton_launches, t):
    x, w = case(t, KIMI["e"], KIMI["h"], "cuda", seed=t)
    assert_within_bound(router_logits(x, w), x, w)
    expected = 1 if t <= router_mod.ROUTER_GEMV_MAX_T else 0
    assert triton_launches["_gemv_kernel"] == expected


@pytest.mark.gpu
@pytest.mark.parametrize("t", [1, 64, 256])
def test_gpu_cuda_graph_replay_equals_eager(t):
    x, w = case(t, KIMI["e"], KIMI["h"], "cuda", seed=40 + t)
    eager = router_logits(x, w)  # compiles outside the capture
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        router_logits(x, w)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = router_logits(x, w)
    x.copy_(case(t, KIMI["e"], KIMI["h"], "cuda", seed=41 + t)[0])
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(captured, router_logits(x, w))  # deterministic: bit-equal to eager
    assert not torch.equal(captured, eager)
