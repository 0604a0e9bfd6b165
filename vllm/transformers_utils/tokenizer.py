"""Tokenizer of a checkpoint folder: its `tokenizer.json` through the `tokenizers` library."""

from pathlib import Path

from tokenizers import Tokenizer


def get_tokenizer(folder: "str | Path") -> Tokenizer:
    """The fast tokenizer saved in `folder/tokenizer.json`."""
    file = Path(folder) / "tokenizer.json"
    if not file.is_file():
        raise ValueError(f"no tokenizer.json in {folder}")
    return Tokenizer.from_file(str(file))
