"""One sequence alone through an engine's model, for the engine tests to compare against: the whole
prompt as one prefill, then one decode per token, on caches of its own (the engine's caches are
rebuilt afterwards, empty, so the engine stays usable between runs)."""

from collections.abc import Callable

import torch

from vllm.models.kimi_k3.amd.metadata import BatchSchedule, KimiMetadataBuilder
from vllm.v1.engine.llm_engine import LLMEngine
from vllm.v1.kv_cache_interface import allocate_kv_caches

BLOCK_SIZE = 4

# (the logits [V] of the next position, the tokens chosen so far) -> the next token
Pick = Callable[[torch.Tensor, list[int]], int]


def greedy(logits: torch.Tensor, out: list[int]) -> int:
    return int(logits.argmax())


def reference_decode(
    engine: LLMEngine, prompt: list[int], max_tokens: int, pick: Pick = greedy
) -> tuple[list[int], list[torch.Tensor]]:
    """The `max_tokens` tokens that `pick` chooses, and the fp32 logits [V] each was chosen
    from."""
    runner = engine.executor.runner
    model = runner.model
    blocks = (len(prompt) + max_tokens) // BLOCK_SIZE + 2
    kda, mla = allocate_kv_caches(runner.spec, blocks + 1, BLOCK_SIZE, 2, runner.device)
    model.bind_kv_caches(kda, mla)
    try:
        builder = KimiMetadataBuilder(
            len(prompt), 1, blocks, BLOCK_SIZE, blocks + 1, 2, runner.device
        )
        table = list(range(1, blocks + 1))
        out, logits, computed, new = [], [], 0, list(prompt)
        with torch.no_grad():
            while len(out) < max_tokens:
                md = builder.build(
                    BatchSchedule([computed], [len(new)], [table], [1], int(computed > 0))
                )
                hidden = model(torch.tensor(new, device=runner.device), md)
                row = model.compute_logits(hidden[-1:])[0].float().cpu()
                computed += len(new)
                out.append(pick(row, out))
                logits.append(row)
                new = [out[-1]]
        return out, logits
    finally:
        _restore_engine_caches(engine)


def prompt_logits(engine: LLMEngine, prompt: list[int]) -> torch.Tensor:
    """fp32 logits [len(prompt), V] of every prompt position, from one prefill of the prompt."""
    runner = engine.executor.runner
    model = runner.model
    blocks = len(prompt) // BLOCK_SIZE + 1
    kda, mla = allocate_kv_caches(runner.spec, blocks + 1, BLOCK_SIZE, 2, runner.device)
    model.bind_kv_caches(kda, mla)
    try:
        builder = KimiMetadataBuilder(
            len(prompt), 1, blocks, BLOCK_SIZE, blocks + 1, 2, runner.device
        )
        table = list(range(1, blocks + 1))
        md = builder.build(BatchSchedule([0], [len(prompt)], [table], [1], 0))
        with torch.no_grad():
            hidden = model(torch.tensor(prompt, device=runner.device), md)
            return model.compute_logits(hidden).float().cpu()
    finally:
        _restore_engine_caches(engine)


def _restore_engine_caches(engine: LLMEngine) -> None:
    cache = engine.config.cache_config
    engine.executor.runner.initialize_cache(cache.num_blocks, cache.num_kda_slots)
