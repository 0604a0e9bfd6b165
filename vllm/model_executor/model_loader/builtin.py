"""Built-in tiny checkpoints, addressable by name: a config and a byte-level tokenizer shipped with
the package (no download), weights from the deterministic dummy initialisation (seed 0).

- `kimi-linear-tiny`: Kimi-Linear's features (low-rank output gate, MLA without q_lora, MoE with a
  shared expert, dense first layer, SiLU) in 4 layers of hidden 256.
- `kimi-k3-tiny`: Kimi-K3's (full-rank gate, gate lower bound, q_lora MLA with output gate, latent
  MoE with norm, SiTU, dense first layer, AttnRes with blocks of 2 layers, so its 4 layers close
  two blocks) with K3's per-GPU KDA shape, 12 heads x 128, at TP=1.
"""

from pathlib import Path

_TINY = Path(__file__).resolve().parents[2] / "models" / "kimi_k3" / "tiny"
BUILTIN_MODELS = {name: _TINY / name for name in ("kimi-linear-tiny", "kimi-k3-tiny")}


def resolve_model(name_or_path: "str | Path", argument: str = "model") -> tuple[Path, bool]:
    """(checkpoint folder, whether it is a built-in tiny model) for a name or a path; `argument`
    names what the user passed it as, in the error."""
    if str(name_or_path) in BUILTIN_MODELS:
        return BUILTIN_MODELS[str(name_or_path)], True
    path = Path(name_or_path)
    if path.resolve() in {folder.resolve() for folder in BUILTIN_MODELS.values()}:
        return path, True  # a built-in model named by its folder (as engine configs carry it)
    if not path.exists():
        raise ValueError(
            f"{argument} {str(name_or_path)!r} is neither a folder nor a built-in model "
            f"({', '.join(BUILTIN_MODELS)})"
        )
    return path, False
