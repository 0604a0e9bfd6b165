"""Reading Hugging Face safetensors checkpoints: one file or shards listed in an index."""

import json
from collections.abc import Iterator
from pathlib import Path

import torch
from safetensors import safe_open
from tqdm import tqdm

_INDEX = "model.safetensors.index.json"


def checkpoint_files(folder: Path) -> list[Path]:
    """The safetensors files of a checkpoint folder, from its index when sharded."""
    index = folder / _INDEX
    if index.is_file():
        weight_map = json.loads(index.read_text()).get("weight_map")
        if not isinstance(weight_map, dict):
            raise ValueError(f"{index}: no 'weight_map' object")
        files = sorted({folder / name for name in weight_map.values()})
        missing = [f.name for f in files if not f.is_file()]
        if missing:
            raise ValueError(f"{index} lists shards that do not exist: {missing}")
        return files
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise ValueError(f"no safetensors checkpoint in {folder}")
    return files


def iterate_tensors(folder: Path, progress: bool = True) -> Iterator[tuple[str, torch.Tensor]]:
    """Yield (name, tensor) for every tensor of the checkpoint, with a progress bar over shards."""
    files = checkpoint_files(folder)
    for file in tqdm(files, desc="Loading safetensors shards", disable=not progress, unit="shard"):
        with safe_open(str(file), framework="pt") as f:
            for name in f.keys():  # noqa: SIM118 (safe_open is not a dict)
                yield name, f.get_tensor(name)
