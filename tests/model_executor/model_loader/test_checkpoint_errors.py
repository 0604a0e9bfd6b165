"""A checkpoint tensor of the wrong shape, dtype or index is refused by name, never loaded into a
wrong model: the checks of loaders that slice a tensor themselves (KDA's conv and `dt_bias`, the
experts), and the dtype check every tensor passes. The model is the built-in kimi-linear-tiny
(layer 0: KDA with a dense MLP; layer 1: KDA with MoE, 8 experts and one shared expert that the
experts' kernels hold as slot 8). A corrupt shard or a malformed shard index is a ValueError
naming the file; a tensor in two files names both; a quantized checkpoint's scales are refused
by name; an error while a tensor loads names it as the checkpoint spells it (`CheckpointError`)."""

import json
import logging
import re

import pytest
import torch
from safetensors.torch import save_file

from vllm.model_executor.model_loader import loader, safetensors_loader
from vllm.model_executor.model_loader.builtin import BUILTIN_MODELS
from vllm.model_executor.model_loader.errors import (
    QUANTIZED_TENSOR_LEAVES,
    CheckpointError,
    ModelSizeError,
)
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


def test_hidden_files_beside_the_shards_are_not_read(tensors, tmp_path):
    """macOS leaves `._<name>` metadata files beside what it copies to a foreign file system:
    they are not shards (one stopped the load as an unreadable shard)."""
    folder = write_checkpoint(tmp_path / "ckpt", tensors)
    (folder / "._model.safetensors").write_bytes(b"\x00\x05\x16\x07" + bytes(4092))
    assert safetensors_loader.checkpoint_files(folder) == [folder / "model.safetensors"]
    load_model(folder, dtype=torch.float32)
    # Nor are they the pickle files the error names when no shard is left.
    (folder / "model.safetensors").unlink()
    (folder / "._model.bin").write_bytes(bytes(16))
    with pytest.raises(ValueError, match=r"^no safetensors checkpoint in \S+$"):
        safetensors_loader.checkpoint_files(folder)


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


def _shards(folder, tensors, split):
    """Two shards and their index: the first `split` tensors, then the rest."""
    names = list(tensors)
    halves = {"a.safetensors": names[:split], "b.safetensors": names[split:]}
    for file, part in halves.items():
        save_file({n: tensors[n].contiguous() for n in part}, folder / file)
    weight_map = {n: file for file, part in halves.items() for n in part}
    (folder / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))


def _with_a_stale_copy(tmp_path, tensors):
    """Two shards and their index, and a zeroed copy of the first shard's first tensor in the
    second: the copy that loaded, silently, before (the output was all zeros)."""
    folder = write_checkpoint(tmp_path / "ckpt", {})
    (folder / "model.safetensors").unlink()
    _shards(folder, tensors, 10)
    name = next(iter(tensors))
    extra = {n: tensors[n] for n in list(tensors)[10:]} | {name: torch.zeros_like(tensors[name])}
    save_file({n: t.contiguous() for n, t in extra.items()}, folder / "b.safetensors")
    return folder, name


def test_the_index_settles_which_copy_of_a_tensor_loads(tensors, tmp_path, caplog):
    folder, name = _with_a_stale_copy(tmp_path, tensors)
    log = logging.getLogger(safetensors_loader.__name__)
    log.addHandler(caplog.handler)
    try:
        model = load_model(folder, dtype=torch.float32)
    finally:
        log.removeHandler(caplog.handler)
    assert name == "model.embed_tokens.weight"  # the index's copy, not the zeroed one
    assert torch.equal(model.embed_tokens.weight, tensors[name])
    assert "1 tensors are also in files the index does not place them in" in caplog.text
    assert f"(the first: '{name}' in {folder / 'b.safetensors'})" in caplog.text


@pytest.mark.parametrize("index", ["none", "elsewhere"])
def test_a_tensor_in_two_files_that_no_index_settles_names_both(tensors, tmp_path, index):
    """Without an index, a stale file beside the checkpoint; with one that places the tensor in
    neither file."""
    folder, name = _with_a_stale_copy(tmp_path, tensors)
    path = folder / "model.safetensors.index.json"
    if index == "none":
        path.unlink()
        where = ""
    else:
        weight_map = json.loads(path.read_text())["weight_map"]
        other = next(n for n, file in weight_map.items() if file == "b.safetensors")
        weight_map[name] = weight_map[other] = "c.safetensors"
        save_file({other: tensors[other].contiguous()}, folder / "c.safetensors")
        path.write_text(json.dumps({"weight_map": weight_map}))
        where = f", and {path} does not list it in either"
    message = (
        f"tensor '{name}' is in both {folder / 'a.safetensors'} and {folder / 'b.safetensors'}"
        f"{where}: which copy to load is unknown"
    )
    with pytest.raises(CheckpointError, match=re.escape(message)):
        load_model(folder, dtype=torch.float32)


@pytest.mark.parametrize("leaf", sorted(QUANTIZED_TENSOR_LEAVES))
@pytest.mark.parametrize("module", ["model.layers.0.mlp.down_proj", KDA + "q_proj"])
def test_a_quantized_checkpoints_tensors_are_named_as_such(tensors, tmp_path, leaf, module):
    """Static FP8's `input_scale` sorts before its `weight`: the error was "unexpected MLP
    tensor 'down_proj.input_scale'", without the layer or the cause."""
    name = f"{module}.{leaf}"
    folder = write_checkpoint(tmp_path / "ckpt", tensors | {name: torch.ones(1)})
    message = (
        f"{name} (in {folder / 'model.safetensors'}): a quantized checkpoint's tensor; quantized "
        "checkpoints are not supported"
    )
    with pytest.raises(CheckpointError, match=re.escape(message)):
        load_model(folder, dtype=torch.float32)


def test_a_skipped_layers_quantized_tensors_load(tensors, tmp_path):
    """A bf16 model whose multi-token-prediction layer (not served) is FP8 with its scales: it
    loads, as before the names were checked."""
    folder = write_checkpoint(tmp_path / "ckpt", {})
    config = json.loads((folder / "config.json").read_text())
    config["num_nextn_predict_layers"] = 1
    (folder / "config.json").write_text(json.dumps(config))
    mtp = f"model.layers.{config['num_hidden_layers']}.self_attn.q_proj"
    extra = {f"{mtp}.weight": torch.zeros(4, 4).to(torch.float8_e4m3fn),
             f"{mtp}.weight_scale_inv": torch.ones(1)}  # fmt: skip
    save_file(
        {k: v.contiguous() for k, v in (tensors | extra).items()}, folder / "model.safetensors"
    )
    load_model(folder, dtype=torch.float32)


@pytest.mark.parametrize(
    "name, shape, said",
    [
        # Fused layers name their own parameter and shard; the checkpoint's name comes first.
        (KDA + "f_a_proj.weight", (256, 64), "in_proj_qkvgfab shard 3"),
        ("model.layers.0.mlp.gate_proj.weight", (512, 128), "gate_up_proj shard 0"),
        (MOE + "shared_experts.gate_proj.weight", (256, 256), "experts.experts.8.w1"),
        (MOE + "experts.3.w1.weight", (256, 128), "experts.experts.3.w1"),
    ],
)
def test_a_tensor_that_fails_to_load_is_named_as_the_checkpoint_spells_it(
    tensors, tmp_path, name, shape, said
):
    folder = write_checkpoint(tmp_path / "ckpt", tensors | {name: torch.zeros(shape)})
    where = re.escape(f"'{name}' (in {folder / 'model.safetensors'}): ")
    with pytest.raises(CheckpointError, match=f"^checkpoint tensor {where}.*{said}"):
        load_model(folder, dtype=torch.float32)


def test_a_shard_without_read_permission_says_so(tensors, tmp_path, monkeypatch):
    """safetensors reports it as "No such file or directory" (faked here: root reads anything)."""
    folder = write_checkpoint(tmp_path / "ckpt", tensors)

    def unreadable(path, *args, **kwargs):
        raise OSError("No such file or directory")

    monkeypatch.setattr(safetensors_loader, "safe_open", unreadable)
    monkeypatch.setattr(safetensors_loader.os, "access", lambda path, mode: False)
    shard = folder / "model.safetensors"
    with pytest.raises(
        CheckpointError, match=f"^{re.escape(str(shard))}: no permission to read it$"
    ):
        load_model(folder, dtype=torch.float32)


def _build_raising(error: str):
    """`loader.build_model` that builds on the meta device and raises `error` elsewhere."""
    built = loader.build_model

    def build(config, dtype, quant, device):
        if torch.device(device).type == "meta":
            return built(config, dtype, quant, device)
        raise RuntimeError(error)

    return build


def test_a_model_larger_than_its_device_names_its_size(monkeypatch):
    """The allocator's own error (a RuntimeError: "DefaultCPUAllocator: can't allocate memory")
    came as a traceback, with no word of the model's size."""
    error = "DefaultCPUAllocator: can't allocate memory: you tried to allocate 9"
    monkeypatch.setattr(loader, "build_model", _build_raising(error))
    message = r"its weights \(0\.\d GB in torch\.float32\) do not fit on cpu: DefaultCPUAllocator"
    with pytest.raises(ModelSizeError, match=message):
        load_model("kimi-linear-tiny", dtype=torch.float32)


def test_other_build_errors_are_not_called_a_size_error(monkeypatch):
    """Only the allocator's words make a RuntimeError of the build a `ModelSizeError`: another
    one, even one that says "allocate", comes out as it was raised."""
    monkeypatch.setattr(loader, "build_model", _build_raising("allocate: bad shape [3, -1]"))
    with pytest.raises(RuntimeError, match=r"^allocate: bad shape \[3, -1\]$") as raised:
        load_model("kimi-linear-tiny", dtype=torch.float32)
    assert type(raised.value) is RuntimeError


def test_moe_tensors_of_a_layer_the_config_makes_dense_name_the_fields(model, tensors):
    """ "unexpected MLP tensor 'experts.0.w1.weight'" named neither the layer nor the cause."""
    name = "model.layers.0.block_sparse_moe.experts.0.w1.weight"
    with pytest.raises(ValueError, match=re.escape(
        f"checkpoint tensor '{name}' is a MoE layer's, but the config makes layer 0 dense "
        "(first_k_dense_replace 1, moe_layer_freq 1)"
    )):  # fmt: skip
        model.load_weights([(name, tensors[MOE + "experts.0.w1.weight"])])


def test_a_stray_files_tensor_is_named_with_its_file(tensors, tmp_path):
    """A LoRA adapter's file beside the checkpoint: "unexpected checkpoint tensor" without the
    file it came from."""
    folder = write_checkpoint(tmp_path / "ckpt", tensors)
    save_file({"base_model.lora_A.weight": torch.zeros(2, 2)}, folder / "adapter_model.safetensors")
    # The whole message: the model's own, which names the tensor already, and its file once.
    message = (
        "unexpected checkpoint tensor 'base_model.lora_A.weight' "
        f"(in {folder / 'adapter_model.safetensors'})"
    )
    with pytest.raises(CheckpointError, match=f"^{re.escape(message)}$"):
        load_model(folder, dtype=torch.float32)
