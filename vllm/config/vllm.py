"""The resolved engine configuration: what `EngineArgs` becomes once every default is decided and
every value checked. Plain dataclasses, picklable (tensor-parallel workers receive a copy)."""

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from vllm.config.generation import GenerationConfig


@dataclass
class ModelConfig:
    """The checkpoint and how it is run."""

    model: str  # what the user named (folder or built-in name)
    folder: Path  # the checkpoint folder it resolved to
    tokenizer: Path | None  # folder holding the tokenizer files (None: skip_tokenizer_init)
    hf_config: Any  # KimiLinearConfig | KimiK3Config
    dtype: torch.dtype
    max_model_len: int
    load_format: str
    seed: int
    quantization_config: dict[str, Any] | None  # the parsed --quantization-config object
    enforce_eager: bool
    max_logprobs: int  # most (prompt_)logprobs a request may ask for; -1: the whole vocabulary
    # eos ids and default sampling from the model's generation config (vllm/config/generation.py)
    generation_config: GenerationConfig = field(default_factory=GenerationConfig)

    @property
    def text_config(self) -> Any:
        """The Kimi-Linear config of the text model (Kimi-K3 nests it)."""
        return getattr(self.hf_config, "text_config", self.hf_config)

    @property
    def vocab_size(self) -> int:
        return self.text_config.vocab_size

    @property
    def logprobs_limit(self) -> int:
        """The most (prompt_)logprobs a request may ask for: `max_logprobs`, within the vocabulary
        (-1: the whole vocabulary). Each listed entry is detokenized on the engine thread at every
        token, so one request listing the whole vocabulary would stall every other request."""
        if self.max_logprobs == -1:
            return self.vocab_size
        return min(self.max_logprobs, self.vocab_size)


@dataclass
class CacheConfig:
    """Paged MLA latent blocks and KDA state slots, and how their memory is decided."""

    block_size: int
    gpu_memory_utilization: float
    num_gpu_blocks_override: int | None
    kv_cache_memory: int | None  # bytes for all caches, instead of profiling
    # Decided by the runner at start-up (including the reserved dummy block and slot).
    num_blocks: int = 0
    num_kda_slots: int = 0


@dataclass
class ParallelConfig:
    tensor_parallel_size: int = 1
    distributed_init_method: str | None = None  # tcp://127.0.0.1:port, chosen by the executor


@dataclass
class SchedulerConfig:
    max_num_seqs: int
    max_num_batched_tokens: int
    max_model_len: int
    # A decode step may be launched before the last one's tokens are read back (AsyncScheduler).
    async_scheduling: bool = False


@dataclass
class CompilationConfig:
    """CUDA-graph capture sizes of decode-only steps (empty when graphs are off)."""

    cudagraph_capture_sizes: list[int]


@dataclass
class VllmConfig:
    model_config: ModelConfig
    cache_config: CacheConfig
    parallel_config: ParallelConfig
    scheduler_config: SchedulerConfig
    compilation_config: CompilationConfig
    device: str  # "cuda" | "cpu"


def decode_batch_class(n: int) -> int:
    """The size class of a decode batch of `n` sequences: the smallest of 1, 2, 4, 8, then every
    8 up to 256 and every 16 beyond, that is at least `n`.

    The CUDA graphs are captured at these sizes, and the decode kernels choose their launch
    (splits, tiles, program counts) for a batch's class rather than its exact size: each new
    launch configuration is a Triton compile (0.3-2 s on an H100) in the step that first meets
    it, so an eager decode (the decode rows of a mixed step, or any step under `--enforce-eager`)
    of any size up to the largest graph reuses kernels that the graphs' capture compiled."""
    if n <= 4:
        return 1 if n <= 1 else 1 << (n - 1).bit_length()
    if n <= 256:
        return -(-n // 8) * 8
    return 256 + -(-(n - 256) // 16) * 16


def resolve_max_num_batched_tokens(max_num_batched_tokens: int | None, max_num_seqs: int) -> int:
    """The tokens of a step: as given, else 8192, or `max_num_seqs` if larger (each running
    sequence's decode token fits in a step). A caller that sizes its workload by the budget (the
    latency benchmark's max_model_len) reads it here, before the engine config is built."""
    return max_num_batched_tokens or max(8192, max_num_seqs)


def cudagraph_capture_sizes(max_num_seqs: int, max_capture_size: int | None) -> list[int]:
    """Decode batch sizes captured as CUDA graphs: the batch classes (`decode_batch_class`: 1, 2,
    4, 8, then every 8 up to 256 and every 16 beyond), capped by `max_num_seqs` and
    `max_capture_size`; the cap itself is always included so every batch up to it has a graph to
    pad to."""
    cap = min(max_num_seqs, max_capture_size if max_capture_size is not None else 512)
    sizes = {decode_batch_class(n) for n in range(1, cap + 1)}
    return sorted({s for s in sizes if s <= cap} | ({cap} if cap >= 1 else set()))
