"""Checkpoint loading speed: write a sharded safetensors checkpoint of a Kimi model, then load it
onto the device in fresh processes and report GB/s and the host's peak memory (issue 12).

The default model is Kimi-Linear-48B-A3B (`kimi-linear-48b-a3b`, the published config) with fewer
routed experts per MoE layer (`--num-experts`, 16 by default: about 10 GB instead of 98 GB, so it
fits the disk of the benchmark machine); every other tensor has its full size. The weights are the
loader's dummy tensors (drawn on `--device`, stored in bf16, fp32 where the model keeps fp32),
under the real checkpoint names, in shards of `--shard-gb` with a `model.safetensors.index.json`.

Each load runs `vllm.model_executor.model_loader.loader.load_model` in a new process (so its peak
memory is its own): checkpoint bytes / seconds from the call to the model on the device with its
weights processed (device synchronized), and the process's peak resident memory (`ru_maxrss`; the
loader reads shards through memory maps, whose pages count while they are mapped). The first load
follows `posix_fadvise(DONTNEED)` on every shard, which asks the kernel to drop their pages from
the page cache (cold: read from disk, where the kernel honours it); the second reads them again
right away (warm: page cache).

    python benchmarks/benchmark_load.py --out /tmp/kimi-48b-e16 --output-json load.json
    python benchmarks/benchmark_load.py --dry-run --out /tmp/load-dry   # tiny model on the CPU
"""

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file
from tqdm import tqdm

from vllm.model_executor.model_loader.builtin import resolve_model
from vllm.model_executor.model_loader.loader import dummy_tensors, load_model
from vllm.model_executor.model_loader.safetensors_loader import checkpoint_files
from vllm.transformers_utils.configs import load_model_config
from vllm.utils.cli import (
    nonnegative_int,
    output_file,
    positive_float,
    run_main,
    write_json,
)

DRY_RUN_MODEL = "kimi-linear-tiny"
INDEX = "model.safetensors.index.json"
# The file that marks a folder as this script's checkpoint: only such a folder (or an empty one)
# is replaced by --out, then deleted without --keep.
MARKER = "BENCHMARK_LOAD_CHECKPOINT"


def check_out(parser: argparse.ArgumentParser, out: Path) -> None:
    """A parser error unless `out` is new, an empty folder or a checkpoint this script wrote: the
    run replaces it and deletes it afterwards, so a folder of anything else (a real checkpoint
    passed by mistake, `.`) would be lost."""
    if not out.exists():
        # Its folder must exist: parents made here were left behind, empty, when --out went.
        if not out.parent.is_dir():
            parser.error(f"argument --out: the folder {str(out.parent)!r} does not exist")
        if not os.access(out.parent, os.W_OK):
            parser.error(f"argument --out: the folder {str(out.parent)!r} is not writable")
        return
    if not out.is_dir():
        parser.error(f"argument --out: {str(out)!r} exists and is not a folder")
    if any(out.iterdir()) and not (out / MARKER).is_file():
        parser.error(
            f"argument --out: {str(out)!r} is not empty and was not written by this script; "
            "the run replaces --out and deletes it afterwards, so pass a new or empty folder"
        )


# Tensors the model keeps in fp32 whatever its dtype (checkpoints store them so too).
FP32_SUFFIXES = ("A_log", "dt_bias", "e_score_correction_bias")


def write_checkpoint(
    model: str, out: Path, num_experts: int | None, shard_gb: float, device: str, seed: int
) -> dict[str, Any]:
    """Write `model`'s config (with `num_experts` routed experts if given) and its dummy weights
    as shards of about `shard_gb` GB to `out`; returns what was written."""
    folder, _ = resolve_model(model)
    try:
        config_json = json.loads((folder / "config.json").read_text())
    except (OSError, ValueError) as e:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        raise ValueError(f"{folder}: no readable config.json ({e})") from None
    if num_experts is not None:
        if "num_experts" not in config_json:
            raise ValueError(f"{model}'s config has no num_experts to change")
        config_json["num_experts"] = num_experts
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    (out / MARKER).write_text("written by benchmarks/benchmark_load.py, which may replace it\n")
    (out / "config.json").write_text(json.dumps(config_json, indent=2) + "\n")
    config = load_model_config(out)
    start = time.perf_counter()
    shards: list[dict[str, torch.Tensor]] = [{}]
    size = 0
    weight_map: dict[str, int] = {}
    for name, tensor in tqdm(dummy_tensors(config, seed, device), desc="drawing", unit="tensor"):
        dtype = torch.float32 if name.endswith(FP32_SUFFIXES) else torch.bfloat16
        tensor = tensor.to(dtype).cpu()
        if size and size + tensor.nbytes > shard_gb * 1e9:
            _save_shard(shards[-1], out / f"part-{len(shards)}")
            shards.append({})
            size = 0
        shards[-1][name] = tensor
        weight_map[name] = len(shards)
        size += tensor.nbytes
    _save_shard(shards[-1], out / f"part-{len(shards)}")
    total = len(shards)
    names = {i: f"model-{i:05d}-of-{total:05d}.safetensors" for i in range(1, total + 1)}
    for i, name in names.items():
        (out / f"part-{i}").rename(out / name)
    index = {"metadata": {}, "weight_map": {k: names[i] for k, i in weight_map.items()}}
    (out / INDEX).write_text(json.dumps(index, indent=1) + "\n")
    files = checkpoint_files(out)
    return {
        "folder": str(out), "shards": len(files), "tensors": len(weight_map),
        "bytes": sum(f.stat().st_size for f in files), "write_s": time.perf_counter() - start,
        "num_experts": config_json.get("num_experts"),
    }  # fmt: skip


def _save_shard(tensors: dict[str, torch.Tensor], path: Path) -> None:
    save_file(tensors, str(path), metadata={"format": "pt"})
    tensors.clear()


def drop_page_cache(folder: Path) -> bool:
    """Ask the kernel to drop the shards' pages (written back first); False where it cannot."""
    if not hasattr(os, "posix_fadvise"):
        return False
    for file in checkpoint_files(folder):
        fd = os.open(file, os.O_RDONLY)
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)
    return True


def load_once(folder: Path, device: str, dtype: str) -> dict[str, Any]:
    """Load `folder` onto `device` in this process; seconds, GB/s and peak host memory."""
    torch_device = torch.device(device)
    rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    files = checkpoint_files(folder)
    nbytes = sum(f.stat().st_size for f in files)
    start = time.perf_counter()
    model = load_model(folder, "safetensors", getattr(torch, dtype), device=torch_device)
    if torch_device.type == "cuda":
        torch.cuda.synchronize(torch_device)
    seconds = time.perf_counter() - start
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    largest = max(p.numel() * p.element_size() for p in model.parameters())
    return {
        "seconds": seconds, "bytes": nbytes, "gb_per_s": nbytes / seconds / 1e9,
        "peak_rss_bytes": peak, "rss_before_load_bytes": rss_before,
        "largest_parameter_bytes": largest,
    }  # fmt: skip


def load_in_child(folder: Path, device: str, dtype: str) -> dict[str, Any]:
    command = [sys.executable, __file__, "--load-only", str(folder), "--device", device,
               "--dtype", dtype]  # fmt: skip
    run = subprocess.run(command, capture_output=True, text=True, check=False)
    if run.returncode != 0:
        raise RuntimeError(f"load failed ({run.returncode}):\n{run.stderr[-3000:]}")
    return json.loads(run.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", default="kimi-linear-48b-a3b", help="built-in name or folder")
    parser.add_argument(
        "--out", type=Path,
        help="checkpoint folder to write: new, empty or written by this script (it is replaced, "
        "and deleted afterwards unless --keep)",
    )  # fmt: skip
    parser.add_argument(
        "--num-experts",
        type=nonnegative_int,
        default=16,
        help="routed experts per MoE layer (0: as config)",
    )
    parser.add_argument("--shard-gb", type=positive_float, default=5.0, help="shard size, GB")
    parser.add_argument(
        "--device", default="cuda", choices=["cuda", "cpu"], help="device to draw and load on"
    )
    parser.add_argument(
        "--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"],
        help="model dtype of the loads",
    )  # fmt: skip
    parser.add_argument("--seed", type=int, default=0, help="seed of the dummy weights")
    parser.add_argument("--keep", action="store_true", help="keep the checkpoint afterwards")
    parser.add_argument(
        "--output-json", type=output_file, help="write the results to this JSON file"
    )
    parser.add_argument("--dry-run", action="store_true", help=f"{DRY_RUN_MODEL} on the CPU")
    parser.add_argument("--load-only", type=Path, help=argparse.SUPPRESS)  # the child process
    args = parser.parse_args(argv)
    if args.load_only is not None:
        print(json.dumps(load_once(args.load_only, args.device, args.dtype)))
        return 0
    if args.dry_run:
        # Here, not at the top: the loading child imports this module, and bench_utils brings the
        # engine's modules into the host memory it reports.
        from bench_utils import apply_dry_run

        apply_dry_run(
            parser, args, model=DRY_RUN_MODEL, device="cpu", dtype="float32", num_experts=4,
            shard_gb=0.002,
        )  # fmt: skip
    if args.out is None:
        parser.error("--out is required")
    check_out(parser, args.out)
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("argument --device: torch sees no GPU (use --device cpu, or --dry-run)")
    record: dict[str, Any] = {
        "benchmark": "load",
        "args": {k: str(v) for k, v in vars(args).items()},
    }
    try:
        record["checkpoint"] = ckpt = write_checkpoint(
            args.model, args.out, args.num_experts or None, args.shard_gb, args.device, args.seed
        )
    except ValueError as e:  # the model's name or config; found before any weight is drawn
        if not args.keep:
            shutil.rmtree(args.out, ignore_errors=True)
        flag = "--num-experts" if "num_experts" in str(e) else "--model"
        parser.error(f"argument {flag}: {e}")
    print(f"wrote {ckpt['bytes'] / 1e9:.2f} GB in {ckpt['shards']} shards "
          f"({ckpt['tensors']} tensors, {ckpt['num_experts']} experts) in {ckpt['write_s']:.1f} s",
          flush=True)  # fmt: skip
    try:
        record["page_cache_dropped"] = drop_page_cache(args.out)
        for kind in ("cold", "warm"):
            record[kind] = r = load_in_child(args.out, args.device, args.dtype)
            print(f"{kind} load: {r['bytes'] / 1e9:.2f} GB in {r['seconds']:.1f} s = "
                  f"{r['gb_per_s']:.2f} GB/s; host peak RSS {r['peak_rss_bytes'] / 2**30:.2f} GiB "
                  f"(largest parameter {r['largest_parameter_bytes'] / 2**20:.0f} MiB)",
                  flush=True)  # fmt: skip
    finally:
        if not args.keep:
            shutil.rmtree(args.out, ignore_errors=True)
    if args.output_json:
        write_json(args.output_json, record, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(run_main(main))
