"""Build script: pure Python on CPU, plus the native `vllm._C` extension for CUDA / ROCm.

`VLLM_TARGET_DEVICE` chooses (cuda | rocm | cpu | empty), as upstream. Unset, it is detected from
the torch that the build can import: a CUDA (or HIP) build of torch with `nvcc` (or `hipcc`) on the
path means cuda (or rocm); anything else, including pip's isolated build environment without
torch, means cpu. A GPU build therefore runs as:

    VLLM_TARGET_DEVICE=cuda pip install -e . --no-build-isolation
"""

import os
import shutil
import subprocess
import sys
from pathlib import Path

from setuptools import Extension, find_packages, setup
from setuptools.command.build_ext import build_ext

ROOT = Path(__file__).parent.resolve()


def detect_target_device() -> str:
    target = os.environ.get("VLLM_TARGET_DEVICE", "").lower()
    if target:
        if target not in ("cuda", "rocm", "cpu", "empty"):
            sys.exit(f"VLLM_TARGET_DEVICE={target!r} must be one of cuda, rocm, cpu, empty")
        return target
    try:
        import torch
    except ImportError:
        return "cpu"
    if torch.version.hip is not None and shutil.which("hipcc"):
        return "rocm"
    if torch.version.cuda is not None and shutil.which("nvcc"):
        return "cuda"
    return "cpu"


def read_requirements(name: str) -> list[str]:
    """Requirements from requirements/<name>, following `-r other.txt` includes."""
    lines: list[str] = []
    for raw in (ROOT / "requirements" / name).read_text().splitlines():
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        if line.startswith("-r "):
            lines += read_requirements(line[3:].strip())
        else:
            lines.append(line)
    return lines


class CMakeExtension(Extension):
    def __init__(self, name: str) -> None:
        super().__init__(name, sources=[])


class CMakeBuild(build_ext):
    """Configure and build CMakeLists.txt, then place the library where Python imports it."""

    def build_extension(self, ext: Extension) -> None:
        build_dir = Path(self.build_temp).resolve() / ext.name
        build_dir.mkdir(parents=True, exist_ok=True)
        jobs = os.environ.get("MAX_JOBS", str(os.cpu_count() or 1))
        subprocess.check_call(
            [
                "cmake",
                str(ROOT),
                "-DCMAKE_BUILD_TYPE=Release",
                f"-DVLLM_TARGET_DEVICE={TARGET_DEVICE}",
                f"-DVLLM_PYTHON_EXECUTABLE={sys.executable}",
            ],
            cwd=build_dir,
        )
        subprocess.check_call(["cmake", "--build", ".", "-j", jobs], cwd=build_dir)
        built = next(p for p in build_dir.glob("_C*") if p.suffix in (".so", ".pyd"))
        target = Path(self.get_ext_fullpath(ext.name))
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(built, target)


TARGET_DEVICE = detect_target_device()
requirements_file = {"cuda": "cuda.txt", "rocm": "rocm.txt", "cpu": "cpu.txt"}.get(
    TARGET_DEVICE, "common.txt"
)
ext_modules = [CMakeExtension("vllm._C")] if TARGET_DEVICE in ("cuda", "rocm") else []

setup(
    name="vllm-k3",
    version="0.1.0",
    description="A vLLM-style engine for Kimi-K3 / Kimi-Linear with PTPC FP8 linears",
    python_requires=">=3.10",
    packages=find_packages(include=["vllm", "vllm.*"]),
    package_data={
        "vllm.models.kimi_k3": [
            "tiny/*/*.json",
            "config_only/*/*.json",
            "trained/*/*.json",
            "trained/*/*.safetensors",
        ]
    },
    install_requires=read_requirements(requirements_file),
    extras_require={"test": read_requirements("test.txt")},
    entry_points={"console_scripts": ["vllm = vllm.entrypoints.cli.main:main"]},
    ext_modules=ext_modules,
    cmdclass={"build_ext": CMakeBuild},
)
