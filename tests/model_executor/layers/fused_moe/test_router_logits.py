"""`router_logits`: the fp32 router logits of bf16 / fp32 hidden states, against exact fp64
products (bound of tests/kernels/linear/test_gemv.py's fp32 section: (K + 2) * 2^-24 *
sum_k |x_k w_k|, (3 K + 2) for bf16x3), its dispatch by T and dtype, argument errors, and on a GPU
Kimi's sizes and graph replay. Data is drawn on the CPU, so that the interpreter (unmarked
tests) and the GPU (`gpu` tests) see the same values for a seed.
"""

import pytest
import torch
import torch.nn.functional as F

from vllm.model_executor.kernels.linear import gemv_config as gemv_cfg
from vllm.model_executor.layers.fused_moe import router as router_mod
from vllm.model_executor.layers.fused_moe.router import router_logits, router_logits_ref

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def case(t: int, e: int, h: int, device: str, seed: int, dtype=torch.bfloat16):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(t, h, generator=gen).to(dtype)
    w = torch.randn(e, h, generator=gen) * h**-0.5
    return x.to(device), w.to(device)


def assert_within_bound(out, x, w, terms_per_k=1):
    xd, wd = x.double(), w.double()
    exact, size = xd @ wd.t(), xd.abs() @ wd.abs().t()
    assert out.dtype == torch.float32 and out.shape == exact.shape
    bound = (terms_per_k * x.shape[1] + 2) * 2**-24 * size
    err = (out.double() - exact).abs()
    assert (err <= bound).all(), f"max excess {(err - bound).max().item():.3g}"


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("t,e,h", [(1, 16, 64), (3, 64, 300), (17, 32, 136)])
def test_matches_exact(monkeypatch, triton_launches, t, e, h, dtype):
    # T = 17 takes the kernel's tl.dot configurations: bf16x3 for bf16 x (above
    # _FP32_BF16X3_MIN_M rows), FMA products for fp32 x (allowed there by the raised threshold).
    monkeypatch.setattr(router_mod, "ROUTER_GEMV_MAX_T", 32)
    x, w = case(t, e, h, DEVICE, seed=t, dtype=dtype)
    terms = 3 if t > gemv_cfg._FP32_BF16X3_MIN_M and dtype == torch.bfloat16 else 1
    assert_within_bound(router_logits(x, w), x, w, terms)
    assert triton_launches["_gemv_kernel"] == 1
    assert_within_bound(router_logits_ref(x, w), x, w)  # the bound holds for cuBLAS / MKL too


def test_dispatch_by_tokens_and_dtype(monkeypatch, triton_launches):
    monkeypatch.setattr(router_mod, "ROUTER_GEMV_MAX_T", 4)
    x, w = case(9, 16, 64, DEVICE, seed=5)
    # Above the threshold only bf16 x takes the kernel (bf16x3); fp32 x: the reference.
    assert torch.equal(router_logits(x.float(), w), F.linear(x.float(), w))
    assert triton_launches["_gemv_kernel"] == 0
    assert_within_bound(router_logits(x, w), x, w, terms_per_k=3)
    assert triton_launches["_gemv_kernel"] == 1
    router_logits(x[:4].float(), w)
    assert triton_launches["_gemv_kernel"] == 2
    router_logits(x.t().contiguous().t()[:4], w)  # x strided on H: the reference
    assert router_logits(x[:0], w).shape == (0, 16)
    assert triton_launches["_gemv_kernel"] == 2


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
    assert_within_bound(router_logits(x, w), x, w, 3 if t > gemv_cfg._FP32_BF16X3_MIN_M else 1)
    assert triton_launches["_gemv_kernel"] == 1  # bf16 x: the kernel at every T


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
