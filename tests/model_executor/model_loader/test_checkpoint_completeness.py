"""Completeness of checkpoint loading (issue 10): a missing tensor is named by its checkpoint name,
also when it is one part of a fused parameter; dummy weights reach every parameter.

Checkpoints are the dummy tensors of the built-in kimi-linear-tiny config written to safetensors
(layer 0: KDA with a dense MLP; layer 1: KDA with MoE; layer 3: MLA)."""

import json

import pytest
import torch
from safetensors.torch import save_file

from vllm.model_executor.model_loader.builtin import BUILTIN_MODELS
from vllm.model_executor.model_loader.loader import (
    dummy_tensors,
    expected_checkpoint_tensors,
    load_model,
)
from vllm.transformers_utils.configs import load_model_config

TINY = BUILTIN_MODELS["kimi-linear-tiny"]


def write(folder, tensors, config=None):
    folder.mkdir(exist_ok=True)
    config = config or json.loads((TINY / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps(config))
    save_file({k: v.contiguous() for k, v in tensors.items()}, folder / "model.safetensors")
    return folder


@pytest.fixture(scope="module")
def tensors():
    return dict(dummy_tensors(load_model_config(TINY), seed=0))


@pytest.mark.parametrize(
    "dropped",
    [
        "model.layers.0.self_attn.k_proj.weight",  # one part of in_proj_qkvgfab
        "model.layers.0.self_attn.g_a_proj.weight",  # the low-rank gate's shard of it
        "model.layers.0.self_attn.q_conv1d.weight",  # one part of conv1d_weight
        "model.layers.1.block_sparse_moe.experts.7.w3.weight",  # one part of experts.w13_weight
        "model.layers.1.block_sparse_moe.gate.weight",  # gate_weight
    ],
)
def test_missing_tensor_is_named_by_its_checkpoint_name(tensors, tmp_path, dropped):
    kept = {k: v for k, v in tensors.items() if k != dropped}
    folder = write(tmp_path / "broken", kept)
    with pytest.raises(ValueError, match=f"missing tensors for the parameters: {dropped}$"):
        load_model(folder, dtype=torch.float32)


def test_many_missing_tensors_show_five_and_a_count(tensors, tmp_path):
    kept = {k: v for k, v in tensors.items() if ".experts." not in k}
    folder = write(tmp_path / "broken", kept)
    dropped = 3 * 8 * 3  # MoE layers 1..3, 8 experts, w1 w2 w3
    with pytest.raises(ValueError, match=f"experts.0.w1.weight, .* and {dropped - 5} more$"):
        load_model(folder, dtype=torch.float32)


def test_transformers_spellings_and_tied_head_load(tensors, tmp_path):
    """Dense MLP as `block_sparse_moe.*`, legacy `(1, 1, H, 1)` A_log, a tied head's saved copy:
    all load, and give the same model as the canonical names."""
    renamed = {}
    for name, t in tensors.items():
        name = name.replace("layers.0.mlp.", "layers.0.block_sparse_moe.")
        renamed[name] = t.reshape(1, 1, -1, 1) if name.endswith("A_log") else t
    canonical = load_model(write(tmp_path / "a", tensors), dtype=torch.float32)
    spelled = load_model(write(tmp_path / "b", renamed), dtype=torch.float32)
    for (name, p), q in zip(canonical.named_parameters(), spelled.parameters(), strict=True):
        assert torch.equal(p, q), name
    config = json.loads((TINY / "config.json").read_text())
    config["tie_word_embeddings"] = True
    embedding = tensors["model.embed_tokens.weight"].to(torch.bfloat16)
    # The saved copy in another dtype is still a copy (values compared in fp32).
    copied = dict(tensors, **{"model.embed_tokens.weight": embedding,
                              "lm_head.weight": embedding.float()})  # fmt: skip
    tied = load_model(write(tmp_path / "c", copied, config), dtype=torch.float32)
    assert torch.equal(tied.lm_head.weight, embedding.float())
    # A head of its own is not a tied head's copy (transformers' KimiLinear saves and uses one
    # even with the flag set): refused, not silently replaced by the embedding; the error names
    # the tensor that showed it. One changed row is enough.
    own = dict(copied, **{"lm_head.weight": embedding.float().index_fill(0, torch.tensor([3]), 1)})
    with pytest.raises(ValueError, match="lm_head.weight differs from model.embed_tokens"):
        load_model(write(tmp_path / "d", own, config), dtype=torch.float32)
    with pytest.raises(ValueError, match="lm_head.weight differs from model.embed_tokens"):
        load_model(write(tmp_path / "e", tensors, config), dtype=torch.float32)
    with pytest.raises(ValueError, match=r"A_log: checkpoint shape \(2, 2\)"):
        spelled.load_weights([("model.layers.0.self_attn.A_log", torch.zeros(2, 2))])


@pytest.mark.parametrize("name", ["kimi-linear-tiny", "kimi-k3-tiny"])
def test_dummy_weights_reach_every_parameter(name):
    """Each dummy tensor is a realistic draw, and no parameter is left at its initial value."""
    model = load_model(name, dtype=torch.float32)
    for pname, p in model.named_parameters():
        assert torch.isfinite(p).all() and float(p.float().std()) > 1e-3, pname
    config = load_model_config(BUILTIN_MODELS[name])
    names = list(expected_checkpoint_tensors(config))
    if name == "kimi-k3-tiny":
        assert all(n.startswith("language_model.") for n in names)
        assert "language_model.output_attn_res_proj.weight" in names
    a = dict(dummy_tensors(config, 5))
    b = dict(dummy_tensors(config, 5))
    assert all(torch.equal(a[n], b[n]) for n in names)
    assert not torch.equal(a[names[0]], dict(dummy_tensors(config, 6))[names[0]])
