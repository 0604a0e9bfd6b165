"""The KDA layer: against transformers' Kimi-Linear KDA module (its pure-torch path), chunked
prefill against one-shot prefill, and the PTPC `o_proj` epilogue (norm exactly once, fused vs
unfused within the bound the bf16 intermediate and one FP8 step imply)."""

import pytest
import torch

import vllm.models.kimi_k3.amd.kda as kda_module
from vllm.config.quantization import parse_quantization_config
from vllm.model_executor.layers.quantization.online.base import OnlineQuantizationConfig
from vllm.models.kimi_k3.amd.kda import KDAMetadata, KDAStatePool, KimiK3DeltaAttention

HIDDEN, HEADS, HEAD_DIM, EPS = 64, 2, 32, 1e-5
HF = None  # transformers' modeling_kimi_linear, set by the fixture below
# The CPU tests run again on a GPU with fla-core's kernels (marked `gpu`).
DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]
# fla's chunk kernels multiply fp32 through `tl.dot`, which on NVIDIA rounds its inputs to TF32
# (11 significant bits, 2^-11 relative): fp32 results carry ~1e-3 relative error on a GPU.
FP32_REL = {"cpu": 1e-4, "cuda": 1e-2}


@pytest.fixture(autouse=True)
def _hf(hf_kimi_linear):
    global HF
    HF = hf_kimi_linear


def hf_kda(seed=0):
    cfg = HF.KimiLinearConfig(
        hidden_size=HIDDEN, num_hidden_layers=1, linear_num_heads=HEADS, linear_head_dim=HEAD_DIM,
        hidden_act="silu", rms_norm_eps=EPS, num_attention_heads=HEADS, num_key_value_heads=HEADS,
        linear_attn_config={"kda_layers": [1], "full_attn_layers": []},
    )  # fmt: skip
    torch.manual_seed(seed)
    module = HF.KimiLinearDeltaAttention(cfg, 0).float()
    with torch.no_grad():
        gate = module.forget_gate
        gate.A_log.copy_(torch.log(torch.empty_like(gate.A_log).uniform_(1, 16)))
        gate.dt_bias.copy_(torch.randn_like(gate.dt_bias) * 0.5)
        module.o_norm.weight.copy_(1 + 0.1 * torch.randn_like(module.o_norm.weight))
    return module


def checkpoint_tensors(hf_module, full_rank=False) -> list[tuple[str, torch.Tensor]]:
    """transformers' in-memory names -> Kimi checkpoint names (what its save_pretrained writes).

    `full_rank`: Kimi-K3's single `g_proj` instead, the product of the low-rank pair (same gate).
    """
    state = dict(hf_module.state_dict())
    if full_rank:
        state["g_proj.weight"] = state.pop("g_b_proj.weight") @ state.pop("g_a_proj.weight")
    out = []
    for name, tensor in state.items():
        if name == "conv1d.weight":
            for prefix, part in zip(("q", "k", "v"), tensor.chunk(3), strict=True):
                out.append((f"{prefix}_conv1d.weight", part))
        else:
            out.append((name.removeprefix("forget_gate."), tensor))
    return out


def our_kda(
    hf_module=None, dtype=torch.float32, quant_config=None, full_rank=False, seed=0, device="cpu"
):
    layer = KimiK3DeltaAttention(
        HIDDEN, HEADS, HEAD_DIM, full_rank_gate=full_rank, norm_eps=EPS, params_dtype=dtype,
        quant_config=quant_config, prefix="model.layers.0.self_attn",
    )  # fmt: skip
    if hf_module is None:
        hf_module = hf_kda(seed)
    loaded = layer.load_weights(checkpoint_tensors(hf_module, full_rank))
    assert "q_conv1d.weight" in loaded and "A_log" in loaded
    layer.to(device)
    for module in layer.modules():  # the causal LM's walk, for a lone layer
        if hasattr(module, "process_weights_after_loading"):
            module.process_weights_after_loading()
    return layer


def metadata(qsl, slots, has_initial, decodes, prefills, device="cpu"):
    return KDAMetadata(
        torch.tensor(qsl, device=device), torch.tensor(slots, device=device),
        torch.tensor(has_initial, device=device), decodes, prefills,
    )  # fmt: skip


def prefill_metadata(lengths, slots, has_initial, device="cpu"):
    qsl = [0, *torch.tensor(lengths).cumsum(0).tolist()]
    return metadata(qsl, slots, has_initial, 0, len(lengths), device)


def decode_metadata(slots, device="cpu"):
    n = len(slots)
    return metadata(list(range(n + 1)), slots, [True] * n, n, 0, device)


def pool_for(layer, dtype=torch.float32, slots=4, device="cpu"):
    return KDAStatePool.allocate(slots, layer.local_heads, HEAD_DIM, 4, dtype, device)


def rel_err(a, b):
    return float((a.float() - b.float()).norm() / b.float().norm())


@pytest.mark.parametrize("device", DEVICES)
def test_layer_matches_transformers_prefill_then_decode(device):
    hf = hf_kda()
    layer = our_kda(hf, device=device)
    lengths, steps = [5, 9, 3], 3
    inputs = [torch.randn(n + steps, HIDDEN) for n in lengths]
    with torch.no_grad():
        expected = [hf(x.unsqueeze(0)).squeeze(0) for x in inputs]  # chunked torch path
        pool = pool_for(layer, device=device)
        meta = prefill_metadata(lengths, [2, 0, 1], [False] * 3, device)
        x = torch.cat([x[:n] for x, n in zip(inputs, lengths, strict=True)])
        got = list(layer(x.to(device), meta, pool).cpu().split(lengths))
        for step in range(steps):
            x = torch.stack([x[n + step] for x, n in zip(inputs, lengths, strict=True)])
            out = layer(x.to(device), decode_metadata([2, 0, 1], device), pool).cpu()
            for i in range(3):
                got[i] = torch.cat([got[i], out[i : i + 1]])
    # fp32 on both sides; on CPU they differ only in summation order (chunked triangular solve
    # vs per-token recurrence): well under 1e-4 relative. On a GPU, TF32 (FP32_REL).
    for g, e in zip(got, expected, strict=True):
        assert rel_err(g, e) < FP32_REL[device]


@pytest.mark.parametrize("device", DEVICES)
def test_chunked_prefill_and_mixed_batches_equal_one_shot(device):
    layer = our_kda(device=device)
    x0, x1 = torch.randn(7, HIDDEN, device=device), torch.randn(12, HIDDEN, device=device)
    with torch.no_grad():
        one_pool = pool_for(layer, device=device)
        meta = prefill_metadata([7, 12], [0, 1], [False] * 2, device)
        one = layer(torch.cat([x0, x1]), meta, one_pool)
        pool = pool_for(layer, device=device)
        meta = prefill_metadata([3, 5], [0, 1], [False] * 2, device)
        a = layer(torch.cat([x0[:3], x1[:5]]), meta, pool)
        # mixed: sequence 0 decodes one token while sequence 1 continues its prefill
        mixed = metadata([0, 1, 5], [0, 1], [True, True], 1, 1, device)
        b = layer(torch.cat([x0[3:4], x1[5:9]]), mixed, pool)
        meta = prefill_metadata([3, 3], [0, 1], [True] * 2, device)
        c = layer(torch.cat([x0[4:], x1[9:]]), meta, pool)
    got0 = torch.cat([a[:3], b[:1], c[:3]])
    got1 = torch.cat([a[3:], b[1:], c[3:]])
    # CPU: the same fp32 recurrence in both (1e-5). GPU: fla's chunked kernel splits the
    # sequences differently in the two runs, each with its own TF32 rounding (FP32_REL).
    bound = 1e-5 if device == "cpu" else FP32_REL[device]
    assert rel_err(got0, one[:7]) < bound and rel_err(got1, one[7:]) < bound
    assert rel_err(pool.ssm_state[:2], one_pool.ssm_state[:2]) < bound
    # The conv state holds projected inputs. CPU: bit-exact. GPU: cuBLAS picks its fp32 kernel by
    # the number of rows, so a row's projection may round differently in the two runs (summation
    # order over 64 products: a few ulps, far under 1e-5 relative).
    if device == "cpu":
        assert torch.equal(pool.conv_state[:2], one_pool.conv_state[:2])
    else:
        assert rel_err(pool.conv_state[:2], one_pool.conv_state[:2]) < 1e-5


# ---------------------------------------------------------------------------------------------
# The PTPC epilogue
# ---------------------------------------------------------------------------------------------

PTPC_O_PROJ = OnlineQuantizationConfig(
    parse_quantization_config(
        {"linear": "fp8_per_channel", "ignore": ["re:(?!.*self_attn\\.o_proj$).*"]}
    )
)


class Counts:
    """Counts norm / quantization calls made by the given layers (check after each forward)."""

    def __init__(self, monkeypatch, *layers):
        self.n = {"o_norm": 0, "fused": 0, "quant": 0, "kernel_quant": 0}

        def wrap(key, fn):
            def counted(*args, **kwargs):
                self.n[key] += 1
                return fn(*args, **kwargs)

            return counted

        monkeypatch.setattr(
            kda_module, "rmsnorm_gated_fp8_per_token",
            wrap("fused", kda_module.rmsnorm_gated_fp8_per_token),
        )  # fmt: skip
        monkeypatch.setattr(
            kda_module, "per_token_fp8_quant", wrap("quant", kda_module.per_token_fp8_quant)
        )
        for layer in layers:
            monkeypatch.setattr(layer.o_norm, "forward", wrap("o_norm", layer.o_norm.forward))
            kernel = getattr(layer.o_proj, "fp8_linear", None)  # a bf16 o_proj has none
            if kernel is not None:
                monkeypatch.setattr(
                    kernel, "quantize_input", wrap("kernel_quant", kernel.quantize_input)
                )

    def take(self):
        n, self.n = self.n, dict.fromkeys(self.n, 0)
        return n


def batches(device="cpu"):
    """(name, metadata, tokens) for a prefill, a decode and a mixed batch over slots 0 and 1.

    The decode batch runs the fused decode kernel, which applies the norm itself."""
    return [
        ("prefill", prefill_metadata([4, 6], [0, 1], [False, False], device), 10),
        ("decode", decode_metadata([0, 1], device), 2),
        ("mixed", metadata([0, 1, 4], [0, 1], [True] * 2, 1, 1, device), 4),
    ]


def test_load_weights_checks_the_norm_weight_shape():
    """A `[1]` o_norm weight would broadcast under `copy_`; it must be refused."""
    layer = KimiK3DeltaAttention(HIDDEN, HEADS, HEAD_DIM, prefix="model.layers.0.self_attn")
    with pytest.raises(ValueError, match=r"self_attn.o_norm.weight: checkpoint shape \(1,\)"):
        layer.load_weights([("o_norm.weight", torch.ones(1))])


def test_full_rank_gate_equals_its_low_rank_factors():
    hf = hf_kda()
    low, full = our_kda(hf), our_kda(hf, full_rank=True)
    x = torch.randn(6, HIDDEN)
    with torch.no_grad():
        a = low(x, prefill_metadata([6], [0], [False]), pool_for(low))
        b = full(x, prefill_metadata([6], [0], [False]), pool_for(full))
    assert rel_err(b, a) < 1e-5


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("full_rank", [True, False], ids=["k3-full-rank-gate", "low-rank-gate"])
def test_ptpc_epilogue_norms_exactly_once_and_matches_unfused(monkeypatch, full_rank, device):
    hf = hf_kda()
    fused = our_kda(hf, torch.bfloat16, PTPC_O_PROJ, full_rank, device=device)
    unfused = our_kda(hf, torch.bfloat16, PTPC_O_PROJ, full_rank, device=device)
    assert fused.o_proj_is_ptpc_fp8()
    monkeypatch.setattr(unfused, "o_proj_is_ptpc_fp8", lambda: False)  # o_norm, then o_proj
    counts = Counts(monkeypatch, fused, unfused)
    pool_f = pool_for(fused, torch.bfloat16, device=device)
    pool_u = pool_for(unfused, torch.bfloat16, device=device)
    seen = []
    unfused.o_proj.register_forward_pre_hook(lambda module, args: seen.append(args[0]))
    w = (unfused.o_proj.weight.float() * unfused.o_proj.weight_scale.t()).t()  # [N, K] dequant
    with torch.no_grad():
        for name, meta, tokens in batches(device):
            normed_in_core = name == "decode"
            x = torch.randn(tokens, HIDDEN, device=device).to(torch.bfloat16)
            out_f = fused(x, meta, pool_f).float()
            assert counts.take() == {
                "o_norm": 0, "fused": 0 if normed_in_core else 1,
                "quant": 1 if normed_in_core else 0, "kernel_quant": 0,
            }  # fmt: skip
            out_u = unfused(x, meta, pool_u).float()
            assert counts.take() == {
                "o_norm": 0 if normed_in_core else 1, "fused": 0, "quant": 0, "kernel_quant": 1
            }  # fmt: skip
            # Same core and weights; the two o_proj activations differ by the bf16 rounding of
            # the normed value, so each code by at most one FP8 step: 2^-3 of the value above the
            # subnormal range, 2^-9 of the token's scale below it. Both outputs round to bf16.
            act = seen.pop().float()
            step = act.abs() * 2**-3 + act.abs().amax(1, keepdim=True) / 448 * 2**-9
            bound = (step @ w.abs().t()) * (1 + 2**-7) + (out_f.abs() + out_u.abs()) * 2**-8
            assert ((out_f - out_u).abs() <= bound).all()


def test_already_normed_core_is_only_quantized(monkeypatch):
    layer = our_kda(None, torch.bfloat16, PTPC_O_PROJ)
    counts = Counts(monkeypatch, layer)
    core = torch.randn(3, HEADS, HEAD_DIM).to(torch.bfloat16)
    gate = torch.randn(3, HEADS, HEAD_DIM).to(torch.bfloat16)
    with torch.no_grad():
        layer._epilogue(core, gate, normed=True)
    assert counts.take() == {"o_norm": 0, "fused": 0, "quant": 1, "kernel_quant": 0}
    monkeypatch.setattr(layer, "o_proj_is_ptpc_fp8", lambda: False)
    with torch.no_grad():
        layer._epilogue(core, gate, normed=True)
    assert counts.take() == {"o_norm": 0, "fused": 0, "quant": 0, "kernel_quant": 1}


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("kernel", [None, "PerTensorTorchFP8ScaledMMLinearKernel"])
def test_non_ptpc_o_proj_takes_the_plain_path(monkeypatch, kernel, device):
    if kernel:
        monkeypatch.setenv("VLLM_FP8_LINEAR_KERNEL", kernel)
        # FP8, but its kernel has no key
        layer = our_kda(None, torch.bfloat16, PTPC_O_PROJ, device=device)
    else:
        layer = our_kda(None, torch.bfloat16, device=device)  # bf16 o_proj
    assert not layer.o_proj_is_ptpc_fp8()
    counts = Counts(monkeypatch, layer)
    with torch.no_grad():
        layer(torch.randn(5, HIDDEN, device=device).to(torch.bfloat16),
              prefill_metadata([5], [0], [False], device),
              pool_for(layer, torch.bfloat16, device=device))  # fmt: skip
    assert counts.take() == {
        "o_norm": 1, "fused": 0, "quant": 0, "kernel_quant": 1 if kernel else 0
    }  # fmt: skip


# ---------------------------------------------------------------------------------------------
# GPU: fla-core kernels, CUDA-graph capture and replay of a PTPC decode step
# ---------------------------------------------------------------------------------------------


@pytest.mark.gpu
def test_gpu_layer_matches_cpu_reference():
    hf = hf_kda()
    cpu = our_kda(hf, torch.bfloat16, PTPC_O_PROJ, full_rank=True)
    gpu = our_kda(hf, torch.bfloat16, PTPC_O_PROJ, full_rank=True, device="cuda")
    pool_c = pool_for(cpu, torch.bfloat16)
    pool_g = pool_for(gpu, torch.bfloat16, device="cuda")
    with torch.no_grad():
        for (_, meta, tokens), (_, meta_g, _) in zip(batches(), batches("cuda"), strict=True):
            x = torch.randn(tokens, HIDDEN).to(torch.bfloat16)
            a = cpu(x, meta, pool_c).float()
            b = gpu(x.cuda(), meta_g, pool_g).float().cpu()
            # bf16 activations, fla's chunked fp32 core vs the fp32 recurrence, FP8 o_proj: the
            # codes may move by one step where bf16 rounding differs.
            assert rel_err(b, a) < 2**-4


@pytest.mark.gpu
def test_gpu_cuda_graph_decode_replays_eagerly():
    layer = our_kda(None, torch.bfloat16, PTPC_O_PROJ, full_rank=True, device="cuda")
    pool = pool_for(layer, torch.bfloat16, slots=8, device="cuda")
    meta = decode_metadata([3, 5], "cuda")
    x = torch.randn(2, HIDDEN, device="cuda").to(torch.bfloat16)
    with torch.no_grad():
        layer(x, meta, pool)  # compile and warm up outside the capture
        start = (pool.conv_state.clone(), pool.ssm_state.clone())
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = layer(x, meta, pool)
        pool.conv_state.copy_(start[0])
        pool.ssm_state.copy_(start[1])
        x.copy_(torch.randn_like(x))
        graph.replay()
        replayed = out.clone()
        pool.conv_state.copy_(start[0])
        pool.ssm_state.copy_(start[1])
        eager = layer(x, meta, pool)
    torch.cuda.synchronize()
    assert torch.equal(replayed, eager)


# ---------------------------------------------------------------------------------------------
# Tensor parallel over heads: TP=2 on CPU (gloo) equals TP=1
# ---------------------------------------------------------------------------------------------


def _tp_worker(rank, tensors, x):
    layer = KimiK3DeltaAttention(
        HIDDEN, HEADS, HEAD_DIM, full_rank_gate=True, norm_eps=EPS,
        params_dtype=torch.float32, prefix="l",
    )  # fmt: skip
    layer.load_weights(tensors)
    with torch.no_grad():
        pool = pool_for(layer)
        a = layer(x[:9], prefill_metadata([4, 5], [0, 1], [False] * 2), pool)
        b = layer(x[9:], decode_metadata([0, 1]), pool)
    return torch.cat([a, b])


@pytest.mark.skipif(torch.cuda.is_available(), reason="the gloo test runs on CPU")
def test_tp2_heads_split_equals_tp1():
    from gloo_tp2 import run_tp2

    hf = hf_kda()
    tensors = checkpoint_tensors(hf, full_rank=True)
    layer = our_kda(hf, full_rank=True)
    x = torch.randn(11, HIDDEN)
    with torch.no_grad():
        pool = pool_for(layer)
        a = layer(x[:9], prefill_metadata([4, 5], [0, 1], [False] * 2), pool)
        b = layer(x[9:], decode_metadata([0, 1]), pool)
    expected = torch.cat([a, b])
    results = run_tp2(_tp_worker, tensors, x)
    for rank in (0, 1):  # each rank: its heads' partial o_proj, all-reduced; fp32 sum order only
        assert rel_err(results[rank], expected) < 1e-5
