"""A checkpoint tensor of the wrong shape, dtype or index is refused by name, never loaded into a
wrong model: the checks of loaders that slice a tensor themselves (KDA's conv and `dt_bias`, the
experts), and the dtype check every tensor passes. The model is the built-in kimi-linear-tiny
(layer 0: KDA with a dense MLP; layer 1: KDA with MoE, 8 experts and one shared expert that the
experts' kernels hold as slot 8). A corrupt shard or a malformed shard index is a ValueError
naming the file."""

import re

import pytest
import torch
from safetensors.torch import save_file

from vllm.model_executor.model_loader.builtin import BUILTIN_MODELS
from vllm.model_executor.model_loader.loader import dummy_tensors, load_model
from vllm.transformers_utils.configs import load_model_config

KDA = "model.layers.0.self_attn."
MOE = "model.layers.1.block_sparse_moe."


@pytest.fixture(scope="module")
def model():
    return load_model("kimi-linear-tiny", dtype=torch.float32)


@pytest.fixture(scope="module")
def tensors():
    return dict(dummy_tensors(load_model_config(BUILTIN_MODELS["kimi-linear-tiny"]), seed=0))


@pytest.mark.parametrize(
    "name, shape",
    [
        ("q_conv1d.weight", (256, 1, 1)),  # a width-1 kernel would broadcast over all 4 taps
        ("k_conv1d.weight", (264, 1, 4)),  # surplus channels would be cut off
        ("v_conv1d.weight", (256, 4, 1)),  # the same numbers in the wrong layout
        ("dt_bias", (264,)),
        ("dt_bias", (512,)),
        ("dt_bias", (1,)),  # was a bare `narrow` RuntimeError
    ],
)
def test_kda_sliced_tensor_of_wrong_shape_is_named(model, name, shape):
    before = {n: p.clone() for n, p in model.layers[0].self_attn.named_parameters()}
    expected = r"\(256, 1, 4\)" if "conv" in name else r"\(256,\)"
    message = rf"{KDA}{name}: checkpoint shape \({shape[0]},.*\), expected {expected}"
    with pytest.raises(ValueError, match=message):
        model.load_weights([(KDA + name, torch.zeros(shape))])
    for n, p in model.layers[0].self_attn.named_parameters():
        assert torch.equal(p, before[n]), n


def test_kda_conv_bias_is_unexpected(model):
    """Kimi's short convolutions have no bias: one in a checkpoint is refused, not dropped."""
    with pytest.raises(ValueError, match="unexpected checkpoint tensor 'q_conv1d.bias'"):
        model.load_weights([(KDA + "q_conv1d.bias", torch.zeros(256))])


def test_kda_conv_and_dt_bias_of_the_right_shape_load(model, tensors):
    names = [KDA + n for n in ("q_conv1d.weight", "k_conv1d.weight", "dt_bias")]
    assert model.load_weights([(n, tensors[n]) for n in names]) == set(names)


def test_expert_beyond_num_experts_is_refused(model, tensors):
    """Expert 8 of an 8-expert config would land in the fused shared expert's slot."""
    assert model.layers[1].block_sparse_moe.fuses_shared_experts
    w13 = model.layers[1].block_sparse_moe.experts.w13_weight.clone()
    extra = tensors[MOE + "experts.0.w1.weight"]
    with pytest.raises(ValueError, match=r"'experts\.8\.w1\.weight' is beyond .* num_experts 8"):
        model.load_weights([(MOE + "experts.8.w1.weight", extra)])
    assert torch.equal(model.layers[1].block_sparse_moe.experts.w13_weight, w13)


@pytest.mark.parametrize(
    "dtype", [torch.float8_e4m3fn, torch.int8, torch.uint8, torch.int32, torch.bool]
)
def test_quantized_or_integer_tensor_is_refused(model, tensors, dtype):
    name = KDA + "q_proj.weight"
    with pytest.raises(ValueError, match=rf"{name}: checkpoint dtype {dtype}, expected floating"):
        model.load_weights([(name, tensors[name].to(dtype))])


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float64])
def test_other_floating_dtypes_are_converted(model, tensors, dtype):
    name = "model.norm.weight"
    model.load_weights([(name, tensors[name].to(dtype))])
    assert torch.equal(model.norm.weight, tensors[name].to(dtype).float())


def write_checkpoint(folder, tensors):
    folder.mkdir()
    (folder / "config.json").write_text(
        (BUILTIN_MODELS["kimi-linear-tiny"] / "config.json").read_text()
    )
    save_file({k: v.contiguous() for k, v in tensors.items()}, folder / "model.safetensors")
    return folder


@pytest.mark.parametrize("keep", [0, 5, 1000, -1000])
def test_corrupt_shard_is_named(tensors, tmp_path, keep):
    """Empty, cut in the header, cut in the data: a ValueError naming the file."""
    folder = write_checkpoint(tmp_path / "ckpt", tensors)
    shard = folder / "model.safetensors"
    shard.write_bytes(shard.read_bytes()[:keep])
    with pytest.raises(ValueError, match=re.escape(f"{shard}: not a readable safetensors file")):
        load_model(folder, dtype=torch.float32)


@pytest.mark.parametrize(
    "index", ["{not json", "[]", '{"weight_map": []}', '{"weight_map": {"a": 3}}', "\xff"]
)
def test_malformed_index_is_named(tensors, tmp_path, index):
    folder = write_checkpoint(tmp_path / "ckpt", tensors)
    path = folder / "model.safetensors.index.json"
    path.write_bytes(index.encode("latin-1"))
    with pytest.raises(ValueError, match=re.escape(f"{path}: ")):
        load_model(folder, dtype=torch.float32)


def test_multi_token_prediction_tensors_are_skipped_whatever_their_dtype(model, monkeypatch):
    # A layer past the served ones (an MTP layer) is never loaded, so its dtype refuses nothing.
    monkeypatch.setattr(model.config, "num_nextn_predict_layers", 1)
    name = f"model.layers.{len(model.layers)}.self_attn.q_proj.weight"
    assert model.load_weights([(name, torch.zeros(4, 4, dtype=torch.float8_e4m3fn))]) == set()
