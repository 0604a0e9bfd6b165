"""The package as a user without an editable install gets it: an sdist, and the wheel built from it.

CI installs with `pip install -e .`, which reads every file straight from the checkout, so nothing
else notices a file that the sdist or the wheel leaves out. `python -m build` and `pip install
<sdist>` build the wheel from the unpacked sdist; setup.py reads requirements/*.txt there (and
CMakeLists.txt, csrc/ for a GPU build), which setuptools does not put in an sdist by itself: the
sdist failed at `FileNotFoundError: requirements/cpu.txt` before MANIFEST.in named them.

The build runs on a copy of the source tree, through setuptools' PEP 517 backend in a subprocess,
so that the checkout gets no egg-info or build/ from it.
"""

import os
import shutil
import subprocess
import sys
import tarfile
import zipfile
from email.parser import Parser
from pathlib import Path

import vllm

ROOT = Path(__file__).resolve().parents[1]
# Files beside the package that the engine never opens: the trained model's log of its training
# run (documentation of how the weights were made, docs/accuracy.md).
NOT_SHIPPED = {"vllm/models/kimi_k3/trained/kimi-linear-arith/train_log.jsonl"}
# Build outputs, caches and a virtual environment kept in the checkout: the sdist takes none of
# them, and copying a venv would cost the test most of its time.
_SKIP_COPY = shutil.ignore_patterns(
    ".*", "venv", "build", "dist", "*.egg-info", "__pycache__", "*.so"
)


def _backend(hook: str, source: Path, out: Path) -> Path:
    """Run setuptools' PEP 517 `hook` (build_sdist / build_wheel) in `source`, as pip's frontend
    does; returns the file it made in `out`."""
    code = f"from setuptools import build_meta as b; print(b.{hook}({str(out)!r}))"
    # cpu: the build picks its requirements file and native extension from the target device; the
    # isolated build pip runs has no torch, which means cpu, so that is the wheel users get.
    env = {**os.environ, "VLLM_TARGET_DEVICE": "cpu"}
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=source, env=env, capture_output=True, text=True
    )
    assert done.returncode == 0, f"{hook} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return out / done.stdout.strip().splitlines()[-1]


def _requirements(name: str) -> list[str]:
    lines: list[str] = []
    for raw in (ROOT / "requirements" / name).read_text().splitlines():
        line = raw.split("#", 1)[0].strip()
        if line.startswith("-r "):
            lines += _requirements(line[3:].strip())
        elif line:
            lines.append(line)
    return lines


def test_wheel_built_from_the_sdist_has_every_package_file(tmp_path):
    source = tmp_path / "source"
    shutil.copytree(ROOT, source, ignore=_SKIP_COPY)
    (tmp_path / "dist").mkdir()
    sdist = _backend("build_sdist", source, tmp_path / "dist")

    with tarfile.open(sdist) as tar:
        top = Path(tar.getnames()[0]).parts[0]
        in_sdist = {str(Path(*Path(n).parts[1:])) for n in tar.getnames()}
        # The "data" filter where this Python has it (3.12+, and late 3.10 / 3.11 releases).
        safe = {"filter": "data"} if hasattr(tarfile, "data_filter") else {}
        tar.extractall(tmp_path / "unpacked", **safe)
    # The CPU wheel first: it is what a user's `pip install <sdist>` does, and its failure says why.
    (tmp_path / "wheel").mkdir()
    wheel = _backend("build_wheel", tmp_path / "unpacked" / top, tmp_path / "wheel")
    # A GPU build from the sdist needs its own requirements file (cuda.txt, rocm.txt) and the
    # native extension's sources too, which the CPU wheel above does not read.
    gpu_inputs = [
        "CMakeLists.txt",
        *(str(p.relative_to(source)) for p in (source / "requirements").glob("*.txt")),
        *(str(p.relative_to(source)) for p in (source / "csrc").rglob("*") if p.is_file()),
    ]
    assert not [f for f in gpu_inputs if f not in in_sdist], "GPU build inputs missing from sdist"

    with zipfile.ZipFile(wheel) as whl:
        in_wheel = set(whl.namelist())
        info = next(n for n in in_wheel if n.endswith(".dist-info/METADATA"))
        metadata = Parser().parsestr(whl.read(info).decode())

    package_files = {
        str(p.relative_to(source)) for p in (source / "vllm").rglob("*") if p.is_file()
    }
    missing = sorted(package_files - NOT_SHIPPED - in_wheel)
    assert not missing, (
        f"files under vllm/ that the wheel lacks (package_data in setup.py): {missing}"
    )
    assert NOT_SHIPPED <= package_files, "NOT_SHIPPED names a file that no longer exists"

    assert metadata["Version"] == vllm.__version__
    requires = metadata.get_all("Requires-Dist")
    assert [r for r in requires if "extra ==" not in r] == _requirements("cpu.txt")
    assert [r.split(";")[0].strip() for r in requires if "extra ==" in r] == _requirements(
        "test.txt"
    )
