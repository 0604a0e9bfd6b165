"""The start-up summary of `vllm serve`: what was loaded, how it is quantized, how much cache it
has and how many requests of full length fit at once."""

import argparse
import collections
import json
import re
from typing import Any

from vllm.logger import init_logger
from vllm.v1.core.kv_cache_utils import blocks_per_sequence

logger = init_logger(__name__)


def quantized_layers(model: Any) -> dict[str, list[str]]:
    """Quant method class name -> names of the linear layers using it (unquantized left out).

    A layer's name is its `prefix`, the name that the quantization config's `ignore` patterns were
    matched against (the module path can differ, e.g. without the checkpoint's `.model`)."""
    layers: dict[str, list[str]] = collections.defaultdict(list)
    for name, module in model.named_modules():
        method = getattr(module, "quant_method", None)
        if method is not None and not type(method).__name__.startswith("Unquantized"):
            layers[type(method).__name__].append(getattr(module, "prefix", None) or name)
    return dict(layers)


def layer_patterns(names: list[str]) -> str:
    """The names with layer indices as `*`, each distinct pattern with its count, e.g.
    `language_model.model.layers.*.self_attn.o_proj (4)`."""
    patterns = collections.Counter(re.sub(r"\.\d+(?=\.|$)", ".*", name) for name in names)
    return ", ".join(f"{pattern} ({count})" for pattern, count in patterns.items())


def log_startup(engine: Any, served_model_names: list[str], args: argparse.Namespace) -> None:
    config = engine.config
    mc, cc, sc = config.model_config, config.cache_config, config.scheduler_config
    tp = config.parallel_config.tensor_parallel_size
    logger.info(
        "Model %s (served as %s): dtype %s, device %s, TP=%d, max_model_len %d",
        mc.model,
        ", ".join(served_model_names),
        str(mc.dtype).removeprefix("torch."),
        config.device,
        tp,
        mc.max_model_len,
    )
    if mc.quantization_config is None:
        logger.info("Quantization: none (weights in %s)", str(mc.dtype).removeprefix("torch."))
    else:
        model = getattr(getattr(engine.executor, "runner", None), "model", None)
        summary = "unknown (the model lives in the workers)"
        if model is not None:
            layers = quantized_layers(model)
            summary = (
                "; ".join(
                    f"{len(names)} layers with {method}: {layer_patterns(names)}"
                    for method, names in layers.items()
                )
                or "no layer matched"
            )
            if tp > 1:
                summary += " (rank 0)"
        logger.info("Online quantization %s: %s", json.dumps(mc.quantization_config), summary)
    kv = engine.kv_cache_manager
    tokens = kv.initial_num_free_blocks * cc.block_size
    # In whole blocks, as they are handed out.
    concurrency = min(
        sc.max_num_seqs,
        kv.initial_num_free_kda_slots,
        kv.initial_num_free_blocks // blocks_per_sequence(mc.max_model_len, cc.block_size),
    )
    logger.info(
        "Cache: %d MLA blocks x %d tokens (%d tokens), %d KDA state slots; max concurrency for "
        "%d-token requests: %d (max_num_seqs %d, max_num_batched_tokens %d)",
        kv.initial_num_free_blocks,
        cc.block_size,
        tokens,
        kv.initial_num_free_kda_slots,
        mc.max_model_len,
        concurrency,
        sc.max_num_seqs,
        sc.max_num_batched_tokens,
    )
    sizes = config.compilation_config.cudagraph_capture_sizes
    if sizes:
        logger.info("CUDA graphs: decode batch sizes 1..%d (capture time logged above)", max(sizes))
    else:
        reason = "--enforce-eager" if mc.enforce_eager else f"device {config.device}"
        logger.info("CUDA graphs: off (%s)", reason)
