"""Built-in models, addressable by name: configs shipped with the package (no download).

Tiny checkpoints (`BUILTIN_MODELS`): a config and a byte-level tokenizer, weights from the
deterministic dummy initialisation (seed 0), so `load_format="auto"` means dummy for them.

- `kimi-linear-tiny`: Kimi-Linear's features (low-rank output gate, MLA without q_lora, MoE with a
  shared expert, dense first layer, SiLU) in 4 layers of hidden 256.
- `kimi-k3-tiny`: Kimi-K3's (full-rank gate, gate lower bound, q_lora MLA with output gate, latent
  MoE with norm, SiTU, dense first layer, AttnRes with blocks of 2 layers, so its 4 layers close
  two blocks) with K3's per-GPU KDA shape, 12 heads x 128, at TP=1.

Config-only models (`CONFIG_ONLY_MODELS`): a published architecture at full size for benchmarks,
with neither weights nor tokenizer, so they load only with an explicit `load_format="dummy"` and
run with `skip_tokenizer_init` (token-id prompts).

- `kimi-linear-48b-a3b`: the `config.json` of Kimi-Linear-48B-A3B-Instruct as published (the
  values quoted in ../shared/docs/upstream-facts.md D and engine-facts 5; without the checkpoint's
  own quantization block). It sets no `max_position_embeddings`: the config default, 1,048,576,
  equals its `model_max_length`. 49.1 B parameters, 3.1 B active per token with the LM head
  (`tests/model_executor/model_loader/test_builtin_models.py` counts them on the meta device).

Trained checkpoints (`TRAINED_MODELS`): real weights shipped as safetensors with their tokenizer,
loaded like any checkpoint folder.

- `kimi-linear-arith`: a 7.4 M-parameter Kimi-Linear (3 KDA + 1 MLA layers, MoE with a shared
  expert, dense first layer) trained by `benchmarks/accuracy/train_arith.py` on generated
  GSM8K-format arithmetic problems (digit-level tokenizer); the model of the accuracy comparisons
  in docs/accuracy.md.
"""

from pathlib import Path

_KIMI = Path(__file__).resolve().parents[2] / "models" / "kimi_k3"
BUILTIN_MODELS = {name: _KIMI / "tiny" / name for name in ("kimi-linear-tiny", "kimi-k3-tiny")}
CONFIG_ONLY_MODELS = {"kimi-linear-48b-a3b": _KIMI / "config_only" / "kimi-linear-48b-a3b"}
TRAINED_MODELS = {"kimi-linear-arith": _KIMI / "trained" / "kimi-linear-arith"}


def resolve_model(name_or_path: "str | Path", argument: str = "model") -> tuple[Path, bool]:
    """(checkpoint folder, whether it is a built-in tiny model) for a name or a path; `argument`
    names what the user passed it as, in the error."""
    if not isinstance(name_or_path, str | Path) or not str(name_or_path).strip():
        raise ValueError(f"{argument} must be a folder or a built-in model, got {name_or_path!r}")
    name = str(name_or_path)
    if name in BUILTIN_MODELS:
        return BUILTIN_MODELS[name], True
    if name in CONFIG_ONLY_MODELS:
        return CONFIG_ONLY_MODELS[name], False
    if name in TRAINED_MODELS:
        return TRAINED_MODELS[name], False
    path = Path(name_or_path)
    if path.resolve() in {folder.resolve() for folder in BUILTIN_MODELS.values()}:
        return path, True  # a built-in model named by its folder (as engine configs carry it)
    if not path.exists():
        raise ValueError(
            f"{argument} {name!r} is neither a folder nor a built-in model "
            f"({', '.join([*BUILTIN_MODELS, *CONFIG_ONLY_MODELS, *TRAINED_MODELS])})"
        )
    if not path.is_dir():
        # A file would be read as config.json (a shard gives a UTF-8 decode error) and then
        # searched for weights as if it were the folder.
        raise ValueError(
            f"{argument} {name!r} is a file, not a folder; pass the folder that holds it"
        )
    return path, False


def check_load_format(folder: "str | Path", load_format: str) -> None:
    """Raise ValueError when `load_format` would read weights that `folder` does not have: a
    config-only model, or a folder without a safetensors checkpoint (a built-in tiny model has
    none either, but "auto" means dummy for it). Checked with the other arguments, before the
    model is built: found while loading, it stopped a server with a traceback after its start."""
    resolved = Path(folder).resolve()
    builtin = resolved in {path.resolve() for path in BUILTIN_MODELS.values()}
    if load_format == "dummy" or (builtin and load_format == "auto"):
        return
    for name, config_only in CONFIG_ONLY_MODELS.items():
        if resolved == config_only.resolve():
            raise ValueError(
                f"load_format {load_format!r}: the built-in {name!r} is a config without weights; "
                "load it with load_format='dummy' (--load-format dummy)"
            )
    from vllm.model_executor.model_loader.errors import CheckpointError
    from vllm.model_executor.model_loader.safetensors_loader import checkpoint_files

    try:
        checkpoint_files(Path(folder))
    except CheckpointError as e:  # a sharded checkpoint, broken: the model is at fault
        raise CheckpointError(f"model: {e}") from None
    except ValueError as e:
        raise ValueError(
            f"load_format {load_format!r}: {e}; load_format='dummy' (--load-format dummy) draws "
            "random weights instead"
        ) from None
