"""Reading Hugging Face safetensors checkpoints: one file or shards listed in an index.

A malformed index or an unreadable (truncated, corrupt) shard is a ValueError naming the file,
not the JSON or safetensors library's own exception without it."""

import json
import os
from collections.abc import Iterator
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open
from tqdm import tqdm

from vllm.model_executor.model_loader.weight_utils import CheckpointError

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
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise ValueError(f"no safetensors checkpoint in {folder}")
    return files


def iterate_tensors(folder: Path, progress: bool = True) -> Iterator[tuple[str, torch.Tensor]]:
    """Yield (name, tensor) for every tensor of the checkpoint, with a progress bar over shards.
    A name in two files is a CheckpointError naming both: which copy is right is unknown (a stale
    file beside a new one, say), and loading both kept the last silently."""
    files = checkpoint_files(folder)
    seen: dict[str, Path] = {}
    for file in tqdm(files, desc="Loading safetensors shards", disable=not progress, unit="shard"):
        try:
            with safe_open(str(file), framework="pt") as f:
                for name in f.keys():  # noqa: SIM118 (safe_open is not a dict)
                    if name in seen:
                        raise CheckpointError(
                            f"tensor {name!r} is in both {seen[name]} and {file}: remove the "
                            "file that should not be there"
                        )
                    seen[name] = file
                    yield name, f.get_tensor(name)
        except (SafetensorError, OSError) as e:
            if not os.access(file, os.R_OK):  # safetensors says "No such file or directory"
                raise CheckpointError(f"{file}: no permission to read it") from None
            raise CheckpointError(f"{file}: not a readable safetensors file: {e}") from None
