"""The requirement files name the packages the code imports, not look-alikes on PyPI."""

import re
from pathlib import Path

REQUIREMENTS = Path(__file__).resolve().parents[2] / "requirements"


def requirement_names(file: str) -> set[str]:
    names = set()
    for line in (REQUIREMENTS / file).read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line and not line.startswith("-"):
            names.add(re.split(r"[<>=!~;\[ ]", line, maxsplit=1)[0].lower())
    return names


def test_rocm_requires_amds_aiter_not_the_asyncio_library():
    # `import aiter` is provided by AMD's `amd-aiter`; PyPI's `aiter` is an asyncio helper
    names = requirement_names("rocm.txt")
    assert "amd-aiter" in names and "aiter" not in names
