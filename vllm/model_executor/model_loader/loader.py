"""`load_model`: config -> model built on its device -> weights (checkpoint or dummy) ->
post-processing.

The model class comes from `vllm.models.registry` by the config's `model_type` (`kimi_linear`:
`KimiLinearForCausalLM`; `kimi_k3`: the text-only `KimiK3ForConditionalGeneration`, which maps
K3's names). The model is constructed directly on the target device and checkpoint tensors are
streamed one at a time into it, so host memory holds one tensor, never the model. Completeness is
tracked by name: the tensors the config implies (the model class's `checkpoint_tensors`) minus
those loaded are reported by their checkpoint names. `load_format="dummy"` draws each of those full
tensors on the device from a generator seeded by (seed, name) and loads it the way a checkpoint
tensor is loaded, so every TP rank holds exactly its shard of the TP=1 weights."""

import hashlib
import logging
import math
import os
import time
from collections.abc import Iterable, Iterator
from pathlib import Path

import torch

from vllm.distributed.parallel_state import tensor_parallel_layout
from vllm.logger import init_logger, quiet_below
from vllm.model_executor.layers.quantization.base_config import QuantizationConfig
from vllm.model_executor.model_loader.builtin import check_load_format, resolve_model
from vllm.model_executor.model_loader.errors import (
    QUANTIZED_CHECKPOINTS,
    QUANTIZED_TENSOR_LEAVES,
    CheckpointError,
    ModelSizeError,
)
from vllm.model_executor.model_loader.safetensors_loader import iterate_tensors
from vllm.models.registry import model_class
from vllm.transformers_utils.configs import load_model_config

logger = init_logger(__name__)


# What torch's CPU allocator says when an allocation fails (a plain RuntimeError).
_CPU_OOM = "can't allocate memory"


def load_model(
    model_path: "str | os.PathLike",
    load_format: str = "auto",
    dtype: torch.dtype = torch.bfloat16,
    quant_config: QuantizationConfig | None = None,
    device: "str | torch.device" = "cpu",
    seed: int = 0,
) -> torch.nn.Module:
    """Build the model of a checkpoint folder (or built-in tiny model name) on `device` and fill
    its weights.

    A built-in tiny model has no weight files: "auto" gives it the dummy weights of seed 0.
    """
    if load_format not in ("auto", "safetensors", "dummy"):
        raise ValueError(f"load_format {load_format!r} is not 'auto', 'safetensors' or 'dummy'")
    folder, builtin = resolve_model(model_path)
    check_load_format(folder, load_format)
    config = load_model_config(folder)
    device = torch.device(device)
    try:
        model = build_model(config, dtype, quant_config, device)
    except RuntimeError as e:  # torch.OutOfMemoryError is one; the CPU allocator's is not
        if not isinstance(e, torch.OutOfMemoryError) and _CPU_OOM not in str(e):
            raise
        meta = build_model(config, dtype, quant_config, "meta")
        size = sum(p.numel() * p.element_size() for p in meta.parameters()) / 1e9
        raise ModelSizeError(
            f"its weights ({size:.1f} GB in {dtype}) do not fit on {device}: {e}"
        ) from None
    if builtin and load_format == "auto":
        load_format, seed = "dummy", 0
    start = time.perf_counter()
    if load_format == "dummy":
        tensors = ((name, t, None) for name, t in dummy_tensors(config, seed, device))
    else:
        tensors = iterate_tensors(folder)
    counter = _TensorStream(tensors)
    loaded = _load_checkpoint(model, counter)
    check_complete(expected_checkpoint_tensors(config), loaded)
    model.process_weights_after_loading()
    if device.type == "cuda":  # copies and dummy draws are asynchronous: time their end
        torch.cuda.synchronize(device)
    seconds = time.perf_counter() - start
    gb = counter.bytes / 1e9
    logger.info(
        # Bytes of the tensors streamed in (dummy ones are drawn in fp32, whatever the model dtype).
        "Loaded %s (%s weights, %.2f GB streamed) from %s onto %s in %.1f s (%.2f GB/s)",
        type(model).__name__, load_format, gb, folder, device, seconds, gb / max(seconds, 1e-9),
    )  # fmt: skip
    return model.eval()


def build_model(
    config: object,
    dtype: torch.dtype = torch.bfloat16,
    quant_config: QuantizationConfig | None = None,
    device: "str | torch.device" = "cpu",
) -> torch.nn.Module:
    """The registered model class of `config`, its parameters allocated on `device`
    (uninitialised; `meta` builds the structure only, for counting), never on the host first."""
    with torch.device(device):
        model = model_class(config)(config, dtype, quant_config)
    if quant_config is not None:
        quant_config.check_model_built(model)
    return model


def check_model_builds(
    config: object,
    dtype: torch.dtype,
    quant_config: QuantizationConfig | None,
    tensor_parallel_size: int,
) -> None:
    """Build the model of `config` on the meta device as a rank of `tensor_parallel_size` ranks
    would (rank 0's shapes stand for every rank's), and drop it: a layer's own refusal (a size
    that does not split over the ranks, `ignore` patterns that split a fused layer) then comes
    before any worker starts or weight loads. Its logs are dropped; the real build says them."""
    with tensor_parallel_layout(tensor_parallel_size), quiet_below(logging.ERROR):
        build_model(config, dtype, quant_config, "meta")


class _TensorStream:
    """Passes the (name, tensor) of (name, tensor, file or None) triples through, counting their
    bytes (for the load-speed log) and keeping the name and file of the one being loaded (None
    while the next is read)."""

    def __init__(self, tensors: Iterable[tuple[str, torch.Tensor, Path | None]]) -> None:
        self.tensors = tensors
        self.bytes = 0
        self.current: str | None = None
        self.current_file: Path | None = None

    def __iter__(self) -> Iterator[tuple[str, torch.Tensor]]:
        tensors = iter(self.tensors)
        while True:
            self.current = None  # an error in reading is the reader's, named by it
            try:
                name, tensor, self.current_file = next(tensors)
            except StopIteration:
                return
            self.current = name
            self.bytes += tensor.numel() * tensor.element_size()
            yield name, tensor


def _load_checkpoint(model: torch.nn.Module, stream: _TensorStream) -> set[str]:
    """`model.load_weights(stream)`; a ValueError while a tensor loads names that tensor as the
    checkpoint spells it, and the file it came from (the model's own message names
    the parameter it was loaded into: for a fused layer, say, its internal name and shard; a
    stray file's tensor was "unexpected" without the file), and a quantized checkpoint's scale or
    codes as such (static FP8's `input_scale` sorts before its weight, and was only
    "unexpected"). Only errors are reworded: a tensor the model skips (a multi-token-prediction
    layer's, say) loads whatever its name."""
    try:
        return model.load_weights(stream)
    except CheckpointError:
        raise
    except ValueError as e:
        name = stream.current
        if name is None:
            raise
        file = stream.current_file
        where = f" (in {file})" if file is not None else ""
        if name.rsplit(".", 1)[-1] in QUANTIZED_TENSOR_LEAVES:
            message = f"{name}{where}: a quantized checkpoint's tensor; {QUANTIZED_CHECKPOINTS}"
            raise CheckpointError(message) from None
        if repr(name) in str(e):  # the message names it already
            raise CheckpointError(f"{e}{where}") from None
        raise CheckpointError(f"checkpoint tensor {name!r}{where}: {e}") from None


def expected_checkpoint_tensors(config: object) -> dict[str, tuple[int, ...]]:
    """Every checkpoint tensor the model of `config` loads, by canonical name, with its full
    shape, in checkpoint order."""
    return model_class(config).checkpoint_tensors(config)


def check_complete(expected: Iterable[str], loaded: set[str]) -> None:
    """Raise ValueError naming the expected checkpoint tensors not loaded (first 5 + count)."""
    missing = [name for name in expected if name not in loaded]
    if missing:
        shown = ", ".join(missing[:5]) + (
            f" and {len(missing) - 5} more" if len(missing) > 5 else ""
        )
        raise CheckpointError(f"the checkpoint is missing tensors for the parameters: {shown}")


def _seed_of(seed: int, name: str) -> int:
    digest = hashlib.sha256(f"{seed}:{name}".encode()).digest()
    return int.from_bytes(digest[:8], "little") & (2**63 - 1)


def dummy_tensors(
    config: object, seed: int, device: "str | torch.device" = "cpu"
) -> Iterator[tuple[str, torch.Tensor]]:
    """Every checkpoint tensor of `config`, full shape, fp32, drawn on `device` at about the scales
    of a trained model from a generator seeded by (seed, name): the same tensors whatever the TP
    size (values depend on the device type, whose generators differ)."""
    device = torch.device(device)
    for name, shape in expected_checkpoint_tensors(config).items():
        gen = torch.Generator(device=device).manual_seed(_seed_of(seed, name))
        leaf = name.rsplit(".", 1)[-1]
        with torch.device(device):
            if leaf == "A_log":
                value = torch.log(torch.rand(shape, generator=gen) * 15 + 1)
            elif leaf in ("dt_bias", "e_score_correction_bias"):
                value = torch.randn(shape, generator=gen) * 0.1
            elif "norm" in name:
                value = 1 + torch.randn(shape, generator=gen) * 0.05
            elif len(shape) >= 2:
                value = torch.randn(shape, generator=gen) / math.sqrt(shape[-1])
            else:
                value = torch.randn(shape, generator=gen) * 0.02
        yield name, value


def fill_dummy_weights(model: torch.nn.Module, seed: int = 0) -> None:
    """Load the dummy weights of `model.config` for `seed` into `model` (on its parameters'
    device), through `model.load_weights` as a checkpoint would be."""
    device = next(model.parameters()).device
    model.load_weights(dummy_tensors(model.config, seed, device))
