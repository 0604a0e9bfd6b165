"""The KDA layer: against transformers' Kimi-Linear KDA module (its pure-torch path), chunked
prefill against one-shot prefill, and the PTPC `o_proj` epilogue (norm exactly once, fused vs
unfused within the bound the bf16 intermediate and one FP8 step imply)."""

import sys

import pytest
import torch
from engine_harness import EngineHarness, SingleLayer

import vllm.models.kimi_k3.amd.kda as kda_module
import vllm.models.kimi_k3.amd.ops.fused_kda_decode_config as decode_config_module
from vllm.config.quantization import parse_quantization_config
from vllm.model_executor.layers.linear import ColumnParallelLinear
from vllm.model_executor.layers.quantization.online.base import OnlineQuantizationConfig
from vllm.models.kimi_k3.amd.kda import KimiK3DeltaAttention
from vllm.models.kimi_k3.amd.ops.fused_kda_decode import KdaDecodeConfig
from vllm.models.kimi_k3.amd.ops.rmsnorm_gated_fp8_per_token import per_token_fp8_quant

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


def hf_kda(seed=0, conv=4):
    cfg = HF.KimiLinearConfig(
        hidden_size=HIDDEN, num_hidden_layers=1, linear_num_heads=HEADS, linear_head_dim=HEAD_DIM,
        hidden_act="silu", rms_norm_eps=EPS, num_attention_heads=HEADS, num_key_value_heads=HEADS,
        linear_attn_config={"kda_layers": [1], "full_attn_layers": [],
                            "short_conv_kernel_size": conv},
    )  # fmt: skip
    torch.manual_seed(seed)  # transformers' initializers draw from the global generator
    module = HF.KimiLinearDeltaAttention(cfg, 0).float()
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        gate = module.forget_gate
        gate.A_log.copy_(torch.log(torch.empty_like(gate.A_log).uniform_(1, 16, generator=gen)))
        gate.dt_bias.copy_(torch.randn(gate.dt_bias.shape, generator=gen) * 0.5)
        module.o_norm.weight.copy_(1 + 0.1 * torch.randn(module.o_norm.weight.shape, generator=gen))
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
    hf_module=None, dtype=torch.float32, quant_config=None, full_rank=False, seed=0, device="cpu",
    conv=4,
):  # fmt: skip
    layer = KimiK3DeltaAttention(
        HIDDEN, HEADS, HEAD_DIM, conv_kernel_size=conv, full_rank_gate=full_rank, norm_eps=EPS,
        params_dtype=dtype, quant_config=quant_config, prefix="model.layers.0.self_attn",
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


def harness_for(layer, dtype=torch.float32, device="cpu", slots=5) -> EngineHarness:
    """Bookkeeping and metadata for one KDA layer, its state pool bound to it."""
    return EngineHarness(SingleLayer(layer, dtype), num_kda_slots=slots, device=device)


def rel_err(a, b):
    return float((a.float() - b.float()).norm() / b.float().norm())


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("conv", [4, 3], ids=["conv4", "conv3"])
def test_layer_matches_transformers_prefill_then_decode(device, conv):
    """Also with a short conv of width 3: the state pool's window comes from the layer."""
    hf = hf_kda(conv=conv)
    layer = our_kda(hf, device=device, conv=conv)
    assert layer.get_kv_cache_spec(torch.float32).conv_shape == (3 * HEADS * HEAD_DIM, conv - 1)
    lengths, steps = [5, 9, 3], 3
    gen = torch.Generator().manual_seed(1)
    inputs = [torch.randn(n + steps, HIDDEN, generator=gen) for n in lengths]
    harness = harness_for(layer, device=device)
    with torch.no_grad():
        expected = [hf(x.unsqueeze(0)).squeeze(0) for x in inputs]  # chunked torch path
        meta = harness.schedule({2: 5, 0: 9, 1: 3}).kda  # slots handed out in another order
        x = torch.cat([x[:n] for x, n in zip(inputs, lengths, strict=True)])
        got = list(layer(x.to(device), meta).cpu().split(lengths))
        for step in range(steps):
            x = torch.stack([x[n + step] for x, n in zip(inputs, lengths, strict=True)])
            meta = harness.schedule({2: 1, 0: 1, 1: 1}).kda
            assert meta.num_decodes == 3
            out = layer(x.to(device), meta).cpu()
            for i in range(3):
                got[i] = torch.cat([got[i], out[i : i + 1]])
    # fp32 on both sides; on CPU they differ only in summation order (chunked triangular solve
    # vs per-token recurrence): well under 1e-4 relative. On a GPU, TF32 (FP32_REL).
    for g, e in zip(got, expected, strict=True):
        assert rel_err(g, e) < FP32_REL[device]


@pytest.mark.parametrize("device", DEVICES)
def test_chunked_prefill_and_mixed_batches_equal_one_shot(device):
    layer = our_kda(device=device)
    gen = torch.Generator().manual_seed(1)
    x0 = torch.randn(7, HIDDEN, generator=gen).to(device)
    x1 = torch.randn(12, HIDDEN, generator=gen).to(device)
    with torch.no_grad():
        one_shot = harness_for(layer, device=device)
        one = layer(torch.cat([x0, x1]), one_shot.schedule({0: 7, 1: 12}).kda)
        one_pool = one_shot.kda_pools[0]
        chunked = harness_for(layer, device=device)
        a = layer(torch.cat([x0[:3], x1[:5]]), chunked.schedule({0: 3, 1: 5}).kda)
        # mixed: sequence 0 decodes one token while sequence 1 continues its prefill
        mixed = chunked.schedule({0: 1, 1: 4}).kda
        assert (mixed.num_decodes, mixed.num_prefills) == (1, 1)
        b = layer(torch.cat([x0[3:4], x1[5:9]]), mixed)
        c = layer(torch.cat([x0[4:], x1[9:]]), chunked.schedule({0: 3, 1: 3}).kda)
        pool = chunked.kda_pools[0]
    assert chunked.slots == one_shot.slots == {0: 1, 1: 2}
    got0 = torch.cat([a[:3], b[:1], c[:3]])
    got1 = torch.cat([a[3:], b[1:], c[3:]])
    # CPU: the same fp32 recurrence in both (1e-5). GPU: fla's chunked kernel splits the
    # sequences differently in the two runs, each with its own TF32 rounding (FP32_REL).
    bound = 1e-5 if device == "cpu" else FP32_REL[device]
    assert rel_err(got0, one[:7]) < bound and rel_err(got1, one[7:]) < bound
    assert rel_err(pool.ssm_state[1:3], one_pool.ssm_state[1:3]) < bound
    # The conv state holds the q/k/v projections of each sequence's last W-1 tokens. BLAS picks its
    # fp32 kernel (blocking, vector width) by the number of rows, on CPU (MKL) as on GPU (cuBLAS),
    # so a row's projection may be summed in another order in the two runs. Two orders of a
    # K-term fp32 dot product differ by at most 2 * gamma_K * sum_k |x_k w_k|, with
    # gamma_K = K u / (1 - K u), u = 2^-24: checked per element.
    w = layer.in_proj_qkvgfab.weight[: pool.conv_state.shape[1]].float()
    width = pool.conv_state.shape[2]
    tails = torch.stack([x0[-width:], x1[-width:]]).float()  # [2, W-1, HIDDEN], oldest first
    magnitude = (tails.abs() @ w.abs().t()).transpose(1, 2)  # [2, C, W-1], the state's layout
    k, u = HIDDEN, 2.0**-24
    bound = 2 * (k * u / (1 - k * u)) * magnitude
    assert rel_err(one_pool.conv_state[1:3], (tails @ w.t()).transpose(1, 2)) < 1e-5  # layout
    assert ((pool.conv_state[1:3] - one_pool.conv_state[1:3]).abs() <= bound).all()


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


# (name, new tokens per sequence, tokens) of a prefill, a decode and a mixed batch over two
# sequences, in this order. The decode batch runs the fused decode kernel, which norms itself.
BATCHES = [
    ("prefill", {0: 4, 1: 6}, 10),
    ("decode", {0: 1, 1: 1}, 2),
    ("mixed", {0: 1, 1: 3}, 4),
]


def test_load_weights_checks_the_norm_weight_shape():
    """A `[1]` o_norm weight would broadcast under `copy_`; it must be refused."""
    layer = KimiK3DeltaAttention(HIDDEN, HEADS, HEAD_DIM, prefix="model.layers.0.self_attn")
    with pytest.raises(ValueError, match=r"self_attn.o_norm.weight: checkpoint shape \(1,\)"):
        layer.load_weights([("o_norm.weight", torch.ones(1))])


def test_full_rank_gate_equals_its_low_rank_factors():
    hf = hf_kda()
    low, full = our_kda(hf), our_kda(hf, full_rank=True)
    x = torch.randn(6, HIDDEN, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        a = low(x, harness_for(low).schedule({0: 6}).kda)
        b = full(x, harness_for(full).schedule({0: 6}).kda)
    assert rel_err(b, a) < 1e-5


def fp8_step(code: torch.Tensor) -> torch.Tensor:
    """One e4m3 step at each code's magnitude (3 mantissa bits; 2^-9 in the subnormal range)."""
    exponent = torch.floor(torch.log2(code.float().abs().clamp(min=2**-9))).clamp(min=-6)
    return torch.exp2(exponent - 3)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("full_rank", [True, False], ids=["k3-full-rank-gate", "low-rank-gate"])
def test_ptpc_epilogue_norms_exactly_once_and_matches_unfused(monkeypatch, full_rank, device):
    """The fused epilogue against per_token_fp8_quant(o_norm(core, gate)), at the activation.

    Only batches that reach the epilogue unnormed are compared (prefill, mixed): a decode-only
    batch normalizes inside the fused decode kernel on both layers, so it would compare one path
    with itself (its numerics are tested against the reference in test_amd_fused_kda_decode.py).
    """
    hf = hf_kda()
    fused = our_kda(hf, torch.bfloat16, PTPC_O_PROJ, full_rank, device=device)
    unfused = our_kda(hf, torch.bfloat16, PTPC_O_PROJ, full_rank, device=device)
    assert fused.o_proj_is_ptpc_fp8()
    monkeypatch.setattr(unfused, "o_proj_is_ptpc_fp8", lambda: False)  # o_norm, then o_proj
    captured = []
    fused_op = kda_module.rmsnorm_gated_fp8_per_token

    def capture(core, weight, gate, eps):
        out = fused_op(core, weight, gate, eps)
        captured.append((core.clone(), gate.clone(), *out))
        return out

    monkeypatch.setattr(kda_module, "rmsnorm_gated_fp8_per_token", capture)
    counts = Counts(monkeypatch, fused, unfused)
    harness_f = harness_for(fused, torch.bfloat16, device)
    harness_u = harness_for(unfused, torch.bfloat16, device)
    gen = torch.Generator().manual_seed(3)
    errors = []
    with torch.no_grad():
        for name, new, tokens in BATCHES:
            x = torch.randn(tokens, HIDDEN, generator=gen).to(torch.bfloat16).to(device)
            meta_f, meta_u = harness_f.schedule(new).kda, harness_u.schedule(new).kda
            if name == "decode":  # keep both pools in step; nothing to compare here
                counts.take()  # the previous batch's reference norm
                fused(x, meta_f)
                # normed and quantized inside the fused decode: no norm, no separate quant
                assert counts.take() == {"o_norm": 0, "fused": 0, "quant": 0, "kernel_quant": 0}
                unfused(x, meta_u), counts.take(), captured.clear()
                continue
            out_f = fused(x, meta_f).float()
            assert counts.take() == {"o_norm": 0, "fused": 1, "quant": 0, "kernel_quant": 0}
            out_u = unfused(x, meta_u).float()
            assert counts.take() == {"o_norm": 1, "fused": 0, "quant": 0, "kernel_quant": 1}
            core, gate, q, scale = captured.pop()
            ref_q, ref_scale = per_token_fp8_quant(
                unfused.o_norm(core, gate).reshape(tokens, HEADS * HEAD_DIM)
            )
            # The unfused norm rounds its output to bf16 (8 significant bits: 2^-8 relative)
            # before the amax; the fused op takes the amax in fp32. Scales therefore agree within
            # 2^-8 relative, i.e. 2^15 fp32 ulps; a norm weight ignored or applied twice moves
            # them by ~10% (weights 1 + 0.1 N(0, 1)).
            assert ((scale - ref_scale).abs() <= ref_scale * 2**-8 * (1 + 2**-8)).all()
            # Codes: value / scale differs by < 2^-7 relative, well under one e4m3 step (2^-3
            # relative): each code stays within one step of the reference's.
            diff = (q.float() - ref_q.float()).abs()
            assert (diff <= torch.maximum(fp8_step(q), fp8_step(ref_q))).all()
            errors.append(rel_err(out_f, out_u))
    # Statistically: a code moves only when value / scale sits within 2^-7 (relative) of a
    # rounding boundary, i.e. for at most about 2^-7 / 2^-4 = 1/8 of the codes, by one step
    # (<= 2^-3 of it). The moves are independent in sign, so the output's relative error is about
    # sqrt(1/8) * 2^-3 ~ 4.4% at worst (we see ~1%); an ignored norm weight gives 9-11%.
    assert max(errors) < 0.045, errors


def test_already_normed_core_is_only_quantized(monkeypatch):
    layer = our_kda(None, torch.bfloat16, PTPC_O_PROJ)
    counts = Counts(monkeypatch, layer)
    gen = torch.Generator().manual_seed(4)
    core = torch.randn(3, HEADS, HEAD_DIM, generator=gen).to(torch.bfloat16)
    gate = torch.randn(3, HEADS, HEAD_DIM, generator=gen).to(torch.bfloat16)
    assert layer.o_proj_is_ptpc_fp8()
    with torch.no_grad():
        layer._epilogue(core, gate, normed=True, quantize=True, dtype=torch.bfloat16)
    assert counts.take() == {"o_norm": 0, "fused": 0, "quant": 1, "kernel_quant": 0}
    with torch.no_grad():  # fusion off: o_proj quantizes the normed core itself
        layer._epilogue(core, gate, normed=True, quantize=False, dtype=torch.bfloat16)
    assert counts.take() == {"o_norm": 0, "fused": 0, "quant": 0, "kernel_quant": 1}


@pytest.mark.parametrize("device", DEVICES)
def test_fusion_switch_off_gives_the_unfused_path(monkeypatch, device):
    """VLLM_KIMI_K3_FUSED_OPROJ_EPILOGUE=0: a PTPC o_proj gets o_norm's output and quantizes it
    itself, on every batch kind; the output equals the unfused path's exactly."""
    hf = hf_kda()
    switched = our_kda(hf, torch.bfloat16, PTPC_O_PROJ, device=device)
    unfused = our_kda(hf, torch.bfloat16, PTPC_O_PROJ, device=device)
    monkeypatch.setattr(unfused, "o_proj_is_ptpc_fp8", lambda: False)
    monkeypatch.setenv("VLLM_KIMI_K3_FUSED_OPROJ_EPILOGUE", "0")
    counts = Counts(monkeypatch, switched, unfused)
    harness_s = harness_for(switched, torch.bfloat16, device)
    harness_u = harness_for(unfused, torch.bfloat16, device)
    gen = torch.Generator().manual_seed(4)
    with torch.no_grad():
        for name, new, tokens in BATCHES:
            x = torch.randn(tokens, HIDDEN, generator=gen).to(torch.bfloat16).to(device)
            out_s = switched(x, harness_s.schedule(new).kda)
            norms = 0 if name == "decode" else 1  # the decode kernel norms itself
            assert counts.take() == {"o_norm": norms, "fused": 0, "quant": 0, "kernel_quant": 1}
            out_u = unfused(x, harness_u.schedule(new).kda)
            counts.take()
            assert torch.equal(out_s, out_u), name


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("block_v", [16, HEAD_DIM], ids=["v-split", "single"])
def test_decode_quantized_in_the_kernel_equals_the_unfused_path(
    monkeypatch, triton_launches, block_v, device
):  # fmt: skip
    """A PTPC decode batch: the fused decode returns the FP8 activation (the V-split variant from
    its epilogue kernel, the single one through per_token_fp8_quant) and o_proj's output equals,
    bit for bit, that of the switch-off path (o_proj quantizing the bf16 core itself); normed once
    (in the kernel), quantized once."""
    monkeypatch.setattr(kda_module, "kda_decode_config", lambda *_: KdaDecodeConfig(block_v, 2))
    hf = hf_kda()
    fused = our_kda(hf, torch.bfloat16, PTPC_O_PROJ, device=device)
    switched = our_kda(hf, torch.bfloat16, PTPC_O_PROJ, device=device)
    counts = Counts(monkeypatch, fused, switched)
    harness_f = harness_for(fused, torch.bfloat16, device)
    harness_s = harness_for(switched, torch.bfloat16, device)
    gen = torch.Generator().manual_seed(9)
    with torch.no_grad():
        for name, new, tokens in BATCHES:
            x = torch.randn(tokens, HIDDEN, generator=gen).to(torch.bfloat16).to(device)
            meta_f, meta_s = harness_f.schedule(new).kda, harness_s.schedule(new).kda
            for kernel in triton_launches:
                triton_launches[kernel] = 0
            out_f = fused(x, meta_f)
            if name == "decode":
                assert counts.take() == {"o_norm": 0, "fused": 0, "quant": 0, "kernel_quant": 0}
                split = block_v < HEAD_DIM
                assert triton_launches["_kda_decode_epilogue_kernel"] == int(split)
                assert triton_launches["_per_token_fp8_quant_kernel"] == int(not split)
            counts.take()
            monkeypatch.setenv("VLLM_KIMI_K3_FUSED_OPROJ_EPILOGUE", "0")
            out_s = switched(x, meta_s)
            monkeypatch.delenv("VLLM_KIMI_K3_FUSED_OPROJ_EPILOGUE")
            if name == "decode":
                assert counts.take() == {"o_norm": 0, "fused": 0, "quant": 0, "kernel_quant": 1}
                assert torch.equal(out_f, out_s)
            counts.take()


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
        meta = harness_for(layer, torch.bfloat16, device).schedule({0: 5}).kda
        x = torch.randn(5, HIDDEN, generator=torch.Generator().manual_seed(5))
        layer(x.to(torch.bfloat16).to(device), meta)
    assert counts.take() == {
        "o_norm": 1, "fused": 0, "quant": 0, "kernel_quant": 1 if kernel else 0
    }  # fmt: skip


# ---------------------------------------------------------------------------------------------
# f_b_proj / g_b_proj inside the decode kernel
# ---------------------------------------------------------------------------------------------


def hf_kda_exact_gate_sums(seed=0):
    """`hf_kda` with weights under which the gate projections' R-term dots are exact in fp32 in
    any order, so that the decode kernel and the linears round the same sums: with inputs in
    steps of 1/2 within [-1, 1] and in_proj shards in steps of 1/16 within [-1/2, 1/2], f_a and
    g_a (HIDDEN terms, bf16) are multiples of 2^-5 of magnitude <= 32; f_b / g_b weights in steps
    of 2^-11 within [-1/8, 1/8] then make every partial sum of their R = 32 terms a multiple of
    2^-16 of magnitude <= 2^7 (23 bits). All exact in bf16."""
    hf = hf_kda(seed)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in hf.named_parameters():
            if name.endswith(("f_b_proj.weight", "g_b_proj.weight")):
                param.copy_(torch.randint(-256, 257, param.shape, generator=gen) / 2048)
            elif name.endswith("_proj.weight") and not name.startswith("o_proj"):
                param.copy_(torch.randint(-8, 9, param.shape, generator=gen) / 16)
    return hf


F_B_QUANTIZED = OnlineQuantizationConfig(
    parse_quantization_config({"linear": "fp8_per_channel", "ignore": ["re:(?!.*f_b(_proj)?$).*"]})
)
# case -> (layer options, calls of f_b_proj and of g_b_proj, if the layer has one, in a decode
# step: 0 where the kernel computes it)
GATE_PROJ_LAYERS = {
    "low-rank": (dict(), (0, 0)),
    "full-rank": (dict(full_rank=True), (0,)),
    "f_b-quantized": (dict(quant_config=F_B_QUANTIZED), (1, 0)),
    "above-threshold": (dict(), (1, 1)),
    "fp32": (dict(dtype=torch.float32), (1, 1)),
}


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("case", list(GATE_PROJ_LAYERS))
def test_decode_runs_plain_gate_projections_in_the_kernel(case, device, monkeypatch):
    """A decode batch of at most GATE_PROJ_MAX_BATCH sequences hands each plain (bf16 / fp16,
    unquantized) gate projection to the decode kernel instead of running it; a quantized one, a
    larger batch, fp32, prefill and mixed batches run the linears. Outputs equal, bit for bit,
    those of the same layer with GATE_PROJ_MAX_BATCH 0 (the linears always), batch by batch;
    the recurrent state too on CPU, and on the GPU within fp32 rounding (see the end)."""
    options, decode_calls = GATE_PROJ_LAYERS[case]
    options = dict(dtype=torch.bfloat16, device=device) | options
    if case == "above-threshold":
        monkeypatch.setattr(decode_config_module, "GATE_PROJ_MAX_BATCH", 1)  # decodes 2
    hf = hf_kda_exact_gate_sums()
    layer, twin = our_kda(hf, **options), our_kda(hf, **options)
    calls = {}
    for name in ("f_b_proj", "g_b_proj"):
        if hasattr(layer, name):
            calls[name] = 0
            forward = getattr(layer, name).forward

            def counted(x, name=name, forward=forward):
                calls[name] += 1
                return forward(x)

            monkeypatch.setattr(getattr(layer, name), "forward", counted)
    harness = harness_for(layer, options["dtype"], device)
    twin_harness = harness_for(twin, options["dtype"], device)
    gen = torch.Generator().manual_seed(4)
    with torch.no_grad():
        for name, new, tokens in BATCHES:
            x = (torch.randint(-2, 3, (tokens, HIDDEN), generator=gen) / 2).to(device)
            x = x.to(options["dtype"])
            out = layer(x, harness.schedule(new).kda)
            with monkeypatch.context() as mp:
                mp.setattr(decode_config_module, "GATE_PROJ_MAX_BATCH", 0)
                expected = twin(x, twin_harness.schedule(new).kda)
            linears = decode_calls if name == "decode" else (1,) * len(calls)
            assert tuple(calls.values()) == linears, name
            calls.update(dict.fromkeys(calls, 0))
            assert torch.equal(out, expected), name
    mine, theirs = harness.kda_pools[0], twin_harness.kda_pools[0]
    assert torch.equal(mine.conv_state, theirs.conv_state)
    if device == "cpu":
        assert torch.equal(mine.ssm_state, theirs.ssm_state)
        return
    # On the GPU the two layers run two compilations of the decode kernel (with and without the
    # projections), and Triton may order the state tile's D-term sums and fmas differently in
    # each. On the H200 (2026-12-01) the same inputs decoded with the gate as a tensor and as a
    # LowRankProj of the same bits (the gate does not enter the state's math) left 501 of 8192
    # state elements of this single-kernel shape (D = 32) different, by at most 1.5e-8; at
    # Kimi-Linear's D = 128 (the V-split kernel) none. So the state agrees to within D fp32
    # roundings of its largest element, not bit for bit.
    bound = HEAD_DIM * 2**-24 * float(theirs.ssm_state.abs().max())
    assert float((mine.ssm_state - theirs.ssm_state).abs().max()) <= bound


def test_only_plain_linears_are_computed_in_the_kernel():
    """Unquantized bf16 / fp16 without bias: what the kernel's fp32 sums and one rounding match."""
    plain = kda_module._is_plain_linear

    def linear(dtype=torch.bfloat16, bias=False, quant_config=None):
        return ColumnParallelLinear(
            HEAD_DIM, 64, bias=bias, params_dtype=dtype, quant_config=quant_config, prefix="f_b"
        )

    assert plain(linear()) and plain(linear(torch.float16))
    assert not plain(linear(bias=True))
    assert not plain(linear(torch.float32))
    assert not plain(linear(quant_config=F_B_QUANTIZED))


# ---------------------------------------------------------------------------------------------
# GPU: fla-core kernels, CUDA-graph capture and replay of a PTPC decode step
# ---------------------------------------------------------------------------------------------


@pytest.mark.gpu
def test_gpu_layer_matches_cpu_reference():
    hf = hf_kda()
    cpu = our_kda(hf, torch.bfloat16, PTPC_O_PROJ, full_rank=True)
    gpu = our_kda(hf, torch.bfloat16, PTPC_O_PROJ, full_rank=True, device="cuda")
    harness_c = harness_for(cpu, torch.bfloat16)
    harness_g = harness_for(gpu, torch.bfloat16, "cuda")
    gen = torch.Generator().manual_seed(6)
    with torch.no_grad():
        for _, new, tokens in BATCHES:
            x = torch.randn(tokens, HIDDEN, generator=gen).to(torch.bfloat16)
            a = cpu(x, harness_c.schedule(new).kda).float()
            b = gpu(x.cuda(), harness_g.schedule(new).kda).float().cpu()
            # bf16 activations, fla's chunked fp32 core vs the fp32 recurrence, FP8 o_proj: the
            # codes may move by one step where bf16 rounding differs.
            assert rel_err(b, a) < 2**-4


@pytest.mark.gpu
def test_gpu_cuda_graph_decode_replays_eagerly():
    layer = our_kda(None, torch.bfloat16, PTPC_O_PROJ, full_rank=True, device="cuda")
    harness = harness_for(layer, torch.bfloat16, "cuda", slots=8)
    pool = harness.kda_pools[0]
    gen = torch.Generator().manual_seed(7)
    x = torch.randn(2, HIDDEN, generator=gen).to(torch.bfloat16).cuda()
    with torch.no_grad():
        layer(x, harness.schedule({0: 1, 1: 1}).kda)  # two one-token prompts
        meta = harness.schedule({0: 1, 1: 1}).kda
        layer(x, meta)  # compile and warm up outside the capture
        start = (pool.conv_state.clone(), pool.ssm_state.clone())
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = layer(x, meta)
        pool.conv_state.copy_(start[0])
        pool.ssm_state.copy_(start[1])
        x.copy_(torch.randn(x.shape, generator=gen))
        graph.replay()
        replayed = out.clone()
        pool.conv_state.copy_(start[0])
        pool.ssm_state.copy_(start[1])
        eager = layer(x, meta)
    torch.cuda.synchronize()
    assert torch.equal(replayed, eager)


# ---------------------------------------------------------------------------------------------
# Tensor parallel over heads: TP=2 on CPU (gloo) equals TP=1
# ---------------------------------------------------------------------------------------------


def _tp_worker(rank, tensors, x, full_rank):
    layer = KimiK3DeltaAttention(
        HIDDEN, HEADS, HEAD_DIM, full_rank_gate=full_rank, norm_eps=EPS,
        params_dtype=torch.float32, prefix="l",
    )  # fmt: skip
    layer.load_weights(tensors)
    with torch.no_grad():
        harness = harness_for(layer)
        a = layer(x[:9], harness.schedule({0: 4, 1: 5}).kda)
        b = layer(x[9:], harness.schedule({0: 1, 1: 1}).kda)
    return torch.cat([a, b])


@pytest.mark.skipif(torch.cuda.is_available(), reason="the gloo test runs on CPU")
@pytest.mark.parametrize("full_rank", [True, False], ids=["k3-full-rank-gate", "low-rank-gate"])
def test_tp2_heads_split_equals_tp1(full_rank):
    """Low rank: f_a and g_a are replicated shards of the fused projection, g_b is split."""
    from gloo_tp2 import run_tp2

    hf = hf_kda()
    tensors = checkpoint_tensors(hf, full_rank=full_rank)
    layer = our_kda(hf, full_rank=full_rank)
    x = torch.randn(11, HIDDEN, generator=torch.Generator().manual_seed(8))
    with torch.no_grad():
        harness = harness_for(layer)
        a = layer(x[:9], harness.schedule({0: 4, 1: 5}).kda)
        b = layer(x[9:], harness.schedule({0: 1, 1: 1}).kda)
    expected = torch.cat([a, b])
    results = run_tp2(_tp_worker, tensors, x, full_rank)
    for rank in (0, 1):  # each rank: its heads' partial o_proj, all-reduced; fp32 sum order only
        assert rel_err(results[rank], expected) < 1e-5


def test_kda_prefill_takes_int64_offsets():
    """int32 offsets would be converted per layer, a new tensor each time: fla-core's per-tensor
    cache of the offsets it reads back to the host would miss (a host sync per layer)."""
    from vllm.models.kimi_k3.amd.ops.kda_core import kda_prefill

    t, heads, d = 3, 1, 4
    x = torch.zeros(t, heads, d)
    with pytest.raises(ValueError, match="query_start_loc must be int64"):
        kda_prefill(x, x, x, x, torch.zeros(t, heads), torch.zeros(2, heads, d, d),
                    torch.tensor([0, t], dtype=torch.int32), torch.tensor([1]),
                    torch.tensor([False]))  # fmt: skip


@pytest.mark.parametrize("lower_bound", [None, -5.0])
@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_kda_prefill_applies_the_gate_itself(device, lower_bound):
    """`gate`: the core takes the gate's raw input and applies it (CPU: `kda_gate`, the same bits
    as the decay handed over; GPU: inside fla-core's chunked cumsum, with a lower bound through
    its `safe_gate` path), and a wrong parameter changes the result. On the GPU against the
    exact fp32 recurrence (the CPU path) on the same bf16 inputs: fla-core keeps its intra-chunk
    matrices and its output in bf16 (2^-9 relative each), which left every one of its paths (the
    decay precomputed, the gate in its kernel, with and without `safe_gate`) 4.0-4.2e-3 off in
    the output and 2.9-3.2e-3 in the states at these sizes and up to 2048 tokens of 128-wide
    heads (H100, docs/performance.md "Forty-fourth run", call 173); the bound is twice that."""
    from vllm.models.kimi_k3.amd.ops.kda_core import KdaGate, kda_prefill
    from vllm.models.kimi_k3.amd.ops.kda_gate import kda_gate

    gen = torch.Generator().manual_seed(4)
    t, heads, d = 70, 2, 64
    dtype = torch.float32 if device == "cpu" else torch.bfloat16
    q, k, v = (torch.randn(t, heads, d, generator=gen).to(dtype) for _ in range(3))
    raw = (torch.randn(t, heads * d, generator=gen) * 2).to(dtype)
    a_log = torch.log(torch.rand(heads, generator=gen) * 15 + 1)
    dt_bias = torch.randn(heads * d, generator=gen) * 0.1
    beta = torch.sigmoid(torch.randn(t, heads, generator=gen).to(dtype).float())
    qsl, slots, init = torch.tensor([0, 30, t]), torch.tensor([2, 0]), torch.tensor([True, False])
    start = torch.randn(3, heads, d, d, generator=gen) * 0.1

    gate = KdaGate(a_log, dt_bias, lower_bound)

    def run(dev, gate_input, gate):
        """The core on `dev`; the CPU (the exact reference) takes the inputs' fp32 values."""
        cast = (lambda y: y.float()) if dev == "cpu" else (lambda y: y.to(dev))
        x = [cast(y) for y in (q, k, v, gate_input.view(t, heads, d), beta)]
        if gate is not None:
            gate = KdaGate(gate.A_log.to(dev), gate.dt_bias.to(dev), gate.lower_bound)
        state = start.clone().to(dev)
        out = kda_prefill(*x, state, qsl.to(dev), slots.to(dev), init.to(dev), gate)
        return out.float().cpu(), state.cpu()

    got, got_state = run(device, raw, gate)
    if device == "cpu":
        decay = kda_gate(raw, a_log, dt_bias, lower_bound)
        expected, expected_state = run("cpu", decay, None)
        assert torch.equal(got, expected) and torch.equal(got_state, expected_state)
    else:
        expected, expected_state = run("cpu", raw, gate)
        assert rel_err(got, expected) < 2**-7
        assert rel_err(got_state, expected_state) < 2**-7
    other, _ = run(device, raw, gate._replace(A_log=a_log + 1))
    assert (other - expected).abs().max() > 0.05 * expected.abs().max()


@pytest.mark.parametrize("device", DEVICES)
def test_steps_hand_the_raw_gate_to_the_core_and_decode_rows_to_the_fused_kernel(
    device, monkeypatch
):
    """Prefill rows, alone or after decodes, pass the gate's raw input and `KdaGate` to
    `kda_prefill` (on the GPU fla-core applies it); the decode rows of a mixed step run
    `fused_kda_decode` on their own rows without its norm (the epilogue norms every row), so no
    state is gathered for them. Both give what transformers computes
    (test_layer_matches_transformers_prefill_then_decode)."""
    from vllm.models.kimi_k3.amd.ops.kda_core import KdaGate

    layer = our_kda(device=device)
    seen, decoded = [], []
    core, fused = kda_module.kda_prefill, kda_module.fused_kda_decode

    def spy(q, k, v, g, beta, *args):
        seen.append((args[4] if len(args) > 4 else None, g.clone()))
        return core(q, k, v, g, beta, *args)

    def spy_fused(mixed_qkv, *args, **kwargs):
        decoded.append((mixed_qkv.shape[0], len(args), kwargs))
        return fused(mixed_qkv, *args, **kwargs)

    monkeypatch.setattr(kda_module, "kda_prefill", spy)
    monkeypatch.setattr(kda_module, "fused_kda_decode", spy_fused)
    harness = harness_for(layer, device=device)
    gen = torch.Generator().manual_seed(2)
    with torch.no_grad():
        layer(torch.randn(9, HIDDEN, generator=gen).to(device), harness.schedule({0: 5, 1: 4}).kda)
        mixed = harness.schedule({0: 1, 1: 3}).kda
        assert (mixed.num_decodes, mixed.num_prefills) == (1, 1)
        layer(torch.randn(4, HIDDEN, generator=gen).to(device), mixed)
    (prefill_gate, raw), (mixed_gate, mixed_raw) = seen
    for gate in (prefill_gate, mixed_gate):
        assert isinstance(gate, KdaGate) and gate.A_log is layer.A_log
        assert gate.dt_bias is layer.dt_bias and gate.lower_bound == layer.gate_lower_bound
    # The raw projection takes both signs, where a decay, -exp(A) * softplus(.), never would.
    for g in (raw, mixed_raw):
        assert (g > 0).any() and (g < 0).any()
    assert mixed_raw.shape[0] == 3  # the prefill rows only
    # One row, the ten positional inputs up to the slots: no norm weight, gate or config.
    assert decoded == [(1, 9, {})]


def test_initial_states_zero_new_sequences_and_leave_the_pool():
    """fla's initial states: each slot's state, zeros (+0.0, NaN states included) for a new
    sequence, bit for bit the zero-filled tensor and `where` they replace; the pool untouched."""
    from vllm.models.kimi_k3.amd.ops.kda_core import _gather_initial

    state = torch.randn(5, 2, 3, 4, generator=torch.Generator().manual_seed(0))
    state[1, 0, 0, 0] = float("nan")
    state[3] = -0.0
    pool = state.clone()
    slots, has_initial = torch.tensor([1, 3, 4, 1]), torch.tensor([False, True, True, True])
    got = _gather_initial(state, slots, has_initial)
    init = pool[slots]
    expected = torch.where(has_initial.view(-1, 1, 1, 1), init, torch.zeros_like(init))
    assert torch.equal(got.view(torch.int32), expected.view(torch.int32))  # bits: NaN, -0.0
    assert torch.equal(state.view(torch.int32), pool.view(torch.int32))


@pytest.mark.parametrize("lower_bound", [None, -5.0])
def test_fla_takes_its_safe_gate_path_for_bounded_gates_only(monkeypatch, lower_bound):
    """A lower-bounded gate's decay lies in [lower_bound, 0): fla-core's `safe_gate` (tensor-core
    intra-chunk products) is valid for it and not for the softplus gate, whose decay is unbounded
    below. The arguments that `fla_chunk_kda`, the call of the eager core and (with the
    fixed-shape arguments) of the prefill graphs, hands fla-core's `chunk_kda` (a stand-in
    module records them)."""
    import types

    from vllm.models.kimi_k3.amd.ops.kda_core import KdaGate, fla_chunk_kda

    calls = []
    fla_kda = types.ModuleType("fla.ops.kda")
    fla_kda.chunk_kda = lambda *args, **kwargs: calls.append((args, kwargs)) or ("out", "final")
    for name, module in (("fla", types.ModuleType("fla")), ("fla.ops", types.ModuleType("fla.ops")),
                         ("fla.ops.kda", fla_kda)):  # fmt: skip
        monkeypatch.setitem(sys.modules, name, module)
    x, h0, cu = torch.zeros(1, 3, 2, 4), torch.zeros(1, 2, 4, 4), torch.tensor([0, 3])
    gate = KdaGate(torch.zeros(2), torch.zeros(8), lower_bound)
    assert fla_chunk_kda(x, x, x, x, x[..., 0], h0, cu, gate) == ("out", "final")
    fla_chunk_kda(x, x, x, x, x[..., 0], h0, cu, gate, use_graph=True, max_num_seqs=1)
    fla_chunk_kda(x, x, x, x, x[..., 0], h0, cu, None)
    (eager, kw), (_, graphed), (_, plain) = calls
    assert len(eager) == 5 and eager[0] is x
    assert kw["safe_gate"] is (lower_bound is not None) and kw["lower_bound"] == lower_bound
    assert kw["use_gate_in_kernel"] and kw["A_log"] is gate.A_log and kw["dt_bias"] is gate.dt_bias
    assert kw["initial_state"] is h0 and kw["cu_seqlens"] is cu and kw["output_final_state"]
    assert kw["use_qk_l2norm_in_kernel"]
    assert graphed == dict(kw, use_graph=True, max_num_seqs=1)
    assert "safe_gate" not in plain and "use_gate_in_kernel" not in plain
