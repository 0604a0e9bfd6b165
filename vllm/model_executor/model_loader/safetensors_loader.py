"""Reading Hugging Face safetensors checkpoints: one file or shards listed in an index.

A malformed index or an unreadable (truncated, corrupt) shard is a CheckpointError naming the
file, not the JSON or safetensors library's own exception without it; so is a tensor in two files
that no index settles."""

import contextlib
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError, safe_open
from tqdm import tqdm

from vllm.logger import init_logger
from vllm.model_executor.model_loader.errors import CheckpointError

logger = init_logger(__name__)

_INDEX = "model.safetensors.index.json"


def _weight_map(index: Path) -> dict[str, str]:
    """The index's tensor name -> shard file name map."""
    try:
        data = json.loads(index.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise CheckpointError(f"{index}: cannot read the shard index: {e}") from None
    weight_map = data.get("weight_map") if isinstance(data, dict) else None
    if not isinstance(weight_map, dict) or not all(
        isinstance(shard, str) for shard in weight_map.values()
    ):
        raise CheckpointError(f"{index}: no 'weight_map' object of tensor name -> shard file name")
    return weight_map


# Files a training run leaves beside its weights, pickled too but not weights.
_TRAINER_STATE = ("training_args", "optimizer", "scheduler", "rng_state")


def checkpoint_files(folder: Path) -> list[Path]:
    """The safetensors files of a checkpoint folder, from its index when sharded: a ValueError
    if it has none, a CheckpointError if its index is malformed or lists missing files."""
    index = folder / _INDEX
    if index.is_file():
        files = sorted({folder / name for name in _weight_map(index).values()})
        missing = [f.name for f in files if not f.is_file()]
        if missing:
            raise CheckpointError(f"{index} lists shards that do not exist: {missing}")
        return files
    # Hidden files are not shards: macOS writes `._<name>` metadata beside every file it copies
    # to a foreign file system, and pathlib's glob matches them.
    files = sorted(p for p in folder.glob("*.safetensors") if not p.name.startswith("."))
    if not files:
        pickled = sorted(
            p.name
            for pattern in ("*.bin", "*.pt", "*.pth")
            for p in folder.glob(pattern)
            if not p.name.startswith((*_TRAINER_STATE, "."))
        )
        if pickled:
            # PyTorch's pickle format runs code when loaded; this fork reads safetensors only.
            raise ValueError(
                f"no safetensors checkpoint in {folder}, only PyTorch pickle files "
                f"({', '.join(pickled[:3])}{', ...' if len(pickled) > 3 else ''}), which are "
                "not supported: convert them to safetensors (transformers' save_pretrained "
                "writes safetensors by default)"
            )
        raise ValueError(f"no safetensors checkpoint in {folder}")
    return files


@contextlib.contextmanager
def _opened(file: Path) -> Iterator[Any]:
    """`safe_open(file)`, its errors (also while reading tensors) a CheckpointError naming it."""
    try:
        with safe_open(str(file), framework="pt") as f:
            yield f
    except (SafetensorError, OSError) as e:
        if not os.access(file, os.R_OK):  # safetensors says "No such file or directory"
            raise CheckpointError(f"{file}: no permission to read it") from None
        raise CheckpointError(f"{file}: not a readable safetensors file: {e}") from None


def _sources(folder: Path, files: list[Path]) -> dict[str, Path]:
    """The file each tensor is read from (from the files' headers). A name in two files loaded
    both, the last copy winning silently (a stale shard beside the checkpoint gave all-zero
    output): the index's file is taken where it holds one of the copies, the others are named
    in a warning; otherwise it is a CheckpointError naming the files."""
    index = folder / _INDEX
    weight_map = _weight_map(index) if index.is_file() else {}
    holders: dict[str, list[Path]] = {}
    for file in files:
        with _opened(file) as f:
            for name in f.keys():  # noqa: SIM118 (safe_open is not a dict)
                holders.setdefault(name, []).append(file)
    sources, ignored = {}, []
    for name, held in holders.items():
        listed = folder / weight_map[name] if name in weight_map else None
        if len(held) > 1 and listed not in held:
            where = f", and {index} does not list it in either" if weight_map else ""
            raise CheckpointError(
                f"tensor {name!r} is in both {held[0]} and {held[1]}{where}: which copy to load "
                "is unknown"
            )
        sources[name] = listed if len(held) > 1 else held[0]
        ignored += [(name, file) for file in held if file != sources[name]]
    if ignored:
        name, file = ignored[0]
        logger.warning(
            "%d tensors are also in files the index does not place them in; those copies are "
            "not loaded (the first: %r in %s)", len(ignored), name, file,
        )  # fmt: skip
    return sources


def iterate_tensors(
    folder: Path, progress: bool = True
) -> Iterator[tuple[str, torch.Tensor, Path]]:
    """Yield (name, tensor, file it was read from) for every tensor of the checkpoint, once each
    (see `_sources`), with a progress bar over shards. The file is for errors' messages."""
    files = checkpoint_files(folder)
    sources = _sources(folder, files)
    for file in tqdm(files, desc="Loading safetensors shards", disable=not progress, unit="shard"):
        with _opened(file) as f:
            for name in f.keys():  # noqa: SIM118 (safe_open is not a dict)
                if sources[name] == file:
                    yield name, f.get_tensor(name), file
