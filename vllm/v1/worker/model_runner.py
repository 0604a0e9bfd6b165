"""The model runner: one per tensor-parallel rank. It owns the model, its caches and the step's
device buffers, turns a `StepInput` (flattened tokens + per-sequence schedule, host data that is
the same on every rank) into logits, and replays CUDA graphs for decode-only steps (and, for the
KDA layers' prefill core, `capture_prefill_graphs`).

Rank 0's runner also samples (`sample`): the scheduler's view of requests never reaches the other
ranks, which only need the flattened batch.

CUDA-graph rule: a decode-only step of N sequences runs the graph captured for the smallest size
B >= N; the N real rows come first and the B - N padded rows use the reserved dummy block 0 and
KDA slot 0 (see `vllm/models/kimi_k3/amd/metadata.py`), so they write nowhere that is read. The
graph covers the model forward and the LM head of all B rows (every decode row samples); input
ids and metadata live in persistent buffers that the builder's `stage` rewrites in place (one
upload) before each replay. Before the capture, one dummy mixed step per size
(`warm_up_mixed_steps`) compiles the other form that mixed steps run their decode rows in, which
their first step of each batch class compiled otherwise.

Asynchronous steps: `sample` only enqueues the sampler and the copy of its results to the host
(`SampledStep` in vllm/v1/outputs.py; `SampledStep.result` waits for them), so the engine can launch
a step that `follows` the last one (`AsyncScheduler`) before reading that one's tokens. Such a step
has no host token ids: `execute` copies the last step's sampled ids into the input buffer on the
device, after the metadata upload, row for row. Everything is ordered by the one stream: the
follower's upload and replay run after the last step's sampler has read its logits. At TP > 1 only
rank 0 has those ids: every rank starts such a step with their broadcast from rank 0
(`_last_sampled_rows`), which the stream waits for before the upload.
"""

import gc
import math
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from functools import partial
from itertools import accumulate, chain
from typing import TypeVar

import numpy as np
import torch
from tqdm import tqdm

from vllm import envs
from vllm.config.quantization import parse_quantization_config
from vllm.config.vllm import VllmConfig
from vllm.distributed import (
    get_tensor_model_parallel_rank,
    get_tensor_model_parallel_world_size,
    tensor_model_parallel_all_reduce,
    tensor_model_parallel_broadcast,
)
from vllm.logger import init_logger
from vllm.model_executor.layers.quantization.online.base import OnlineQuantizationConfig
from vllm.model_executor.model_loader.loader import load_model
from vllm.models.kimi_k3.amd.metadata import BatchSchedule, KimiMetadataBuilder
from vllm.models.kimi_k3.amd.ops.kda_prefill_graphs import KdaPrefillGraphs
from vllm.models.registry import model_class
from vllm.platforms import current_platform
from vllm.utils.gc_utils import collector_paused
from vllm.utils.torch_utils import async_tensor_h2d
from vllm.v1.core.kv_cache_utils import CacheSizeError
from vllm.v1.core.sched.output import SchedulerOutput
from vllm.v1.kv_cache_interface import allocate_kv_caches
from vllm.v1.outputs import SampledStep, copy_to_host
from vllm.v1.sample.metadata import SamplingMetadata
from vllm.v1.sample.sampler import Sampler, compute_prompt_logprobs
from vllm.v1.worker.warm_up_bands import warm_up_bands

logger = init_logger(__name__)

_T = TypeVar("_T")


def startup_progress(items: list[_T], desc: str) -> Iterable[_T]:
    """`items` behind a progress bar on stderr, on the first TP rank only (the others run the
    same steps): start-up work that takes minutes on a fresh machine (Triton compiles,
    fla-core's tuning), which the log sums up only at its end. On the first rank `disable` is
    left to tqdm's environment (`TQDM_DISABLE=1` turns the bars off)."""
    off = {"disable": True} if get_tensor_model_parallel_rank() != 0 else {}
    return tqdm(items, desc=desc, **off)


# Memory kept free for CUDA-graph pools and allocator fragmentation when sizing from
# gpu_memory_utilization.
_GRAPH_RESERVE_BYTES = 512 << 20
_CPU_DEFAULT_CACHE_BYTES = 1 << 30


@dataclass
class StepInput:
    """One forward, as every rank needs it: host data only (picklable for the TP workers)."""

    input_ids: list[int] | None  # None: the last step's sampled ids, one per row (on the device)
    batch: BatchSchedule
    logits_rows: list[int]  # token rows whose logits are computed, in this order


@dataclass
class SamplePlan:
    """Rank 0's bookkeeping of which logits row belongs to which request."""

    sample_requests: list = field(default_factory=list)  # Request per sampling row
    # (request_id, first row, number of rows, target token ids) per prompt-logprob slice
    prompt_slices: list[tuple[str, int, int, list[int], int]] = field(default_factory=list)


class ModelRunner:
    def __init__(self, config: VllmConfig, rank: int = 0) -> None:
        self.config = config
        self.rank = rank
        if config.device == "cuda":
            self.device = torch.device("cuda", rank)
            torch.cuda.set_device(self.device)
        else:
            self.device = torch.device("cpu")
        sched = config.scheduler_config
        self.max_num_seqs = sched.max_num_seqs
        sizes = config.compilation_config.cudagraph_capture_sizes
        self.max_num_tokens = max(sched.max_num_batched_tokens, max(sizes, default=0))
        self.block_size = config.cache_config.block_size
        self.graphs: dict[int, tuple[torch.cuda.CUDAGraph, torch.Tensor]] = {}
        self.sampler = Sampler()
        self.generators: dict[str, torch.Generator] = {}
        # Requests without a seed draw from this one, seeded with the engine's `seed` (as
        # upstream: the same seed samples the same tokens run after run), not from the process's
        # default generator, which the caller's code shares. Any integer is a seed (the dummy
        # weights hash it); torch's generators take [0, 2**64).
        self.unseeded_generator = torch.Generator(device=self.device).manual_seed(
            config.model_config.seed % 2**64
        )
        self.prompt_logprobs_done: dict[str, int] = {}
        self._last_sampling: tuple[list, SamplingMetadata] | None = None
        # The last step's sampled ids, on the device: the input of a step that follows it. Only
        # rank 0 samples; at TP > 1 the other ranks receive them into `received_ids`.
        self.last_sampled: torch.Tensor | None = None
        # The KDA prefill core's graphs, once captured (`load_model`).
        self.prefill_graphs: KdaPrefillGraphs | None = None
        # Whether the start-up prefill steps of `_warm_up_prefill_bands` have run.
        self.prefill_bands_warmed = False
        self.received_ids = torch.empty(
            self.max_num_seqs if rank else 0, dtype=torch.int64, device=self.device
        )

    # -- start-up ---------------------------------------------------------------------------

    def load_model(self) -> None:
        mc = self.config.model_config
        quant = None
        if mc.quantization_config is not None:
            quant = OnlineQuantizationConfig(
                parse_quantization_config(mc.quantization_config),
                model_class(mc.hf_config).packed_modules_mapping,
            )
        self.model = load_model(mc.folder, mc.load_format, mc.dtype, quant, self.device, mc.seed)
        self.spec = self.model.get_kv_cache_spec()
        self.vocab_size = mc.vocab_size
        self.capture_prefill_graphs()

    def capture_prefill_graphs(self) -> None:
        """Capture the KDA prefill core's graphs (kda_prefill_graphs.py) on CUDA without
        `enforce_eager` unless `VLLM_KDA_PREFILL_GRAPHS=0`, and log their seconds and memory.
        Before the cache sizing, so that the memory they hold counts as used."""
        mc = self.config.model_config
        on_cuda = self.device.type == "cuda" and current_platform.is_cuda()
        if not on_cuda or mc.enforce_eager or not envs.VLLM_KDA_PREFILL_GRAPHS:
            return
        start = time.perf_counter()
        sched = self.config.scheduler_config
        torch.cuda.empty_cache()
        free = torch.cuda.mem_get_info(self.device)[0]
        with torch.no_grad():
            self.prefill_graphs = self.model.capture_prefill_graphs(
                sched.max_num_batched_tokens, self.max_num_seqs,
                partial(startup_progress, desc="Capturing KDA prefill graphs"),
            )  # fmt: skip
        torch.cuda.synchronize(self.device)
        elapsed = time.perf_counter() - start
        if self.prefill_graphs is not None:
            # The warm-ups' freed tensors are not held by the graphs, nor what the capture left in
            # reference cycles (it ran with the collector paused: `collector_paused`).
            gc.collect()
            torch.cuda.empty_cache()
            held = free - torch.cuda.mem_get_info(self.device)[0]
            logger.info("Captured %d KDA prefill graphs in %.1f s (%.2f GiB)",
                        len(self.prefill_graphs.replays), elapsed, held / 2**30)  # fmt: skip

    def available_cache_memory(self) -> int:
        """Bytes the caches may take on this rank (the minimum over TP ranks): measured after a
        profiling forward of a full step on GPU, else the explicit `kv_cache_memory` (CPU
        default 1 GiB)."""
        cc = self.config.cache_config
        if cc.kv_cache_memory is not None or not self._on_gpu():
            budget = cc.kv_cache_memory or _CPU_DEFAULT_CACHE_BYTES
        else:
            budget = self._profile_gpu_budget()
        if get_tensor_model_parallel_world_size() > 1:
            t = torch.tensor([budget], dtype=torch.float64, device=self.device)
            budget = int(tensor_model_parallel_all_reduce(t, torch.distributed.ReduceOp.MIN))
        # After the reduction, so that every rank raises: one rank raising before it would leave
        # the others waiting in it until the collective timeout.
        if budget <= 0:
            raise ValueError(
                "no GPU memory left for the caches: raise gpu_memory_utilization or lower "
                "max_num_batched_tokens"
            )
        return budget

    def _profile_gpu_budget(self) -> int:
        """Run the largest step the scheduler can produce (max_num_batched_tokens of prefill in
        up to max_num_seqs sequences, logits of max_num_seqs rows), then the smaller prefill
        steps of `_warm_up_prefill_bands`, on throw-away caches, and give the caches what
        gpu_memory_utilization leaves after weights and the peak (<= 0 when nothing is left:
        `available_cache_memory` raises, on every rank)."""
        torch.cuda.synchronize(self.device)
        # Blocks the allocator keeps cached (loading's transient tensors: the 48B model's dummy
        # fp32 embedding alone is 1.4 GiB) are free for the caches, not used.
        torch.cuda.empty_cache()
        free, total = torch.cuda.mem_get_info(self.device)
        used = total - free
        torch.cuda.reset_peak_memory_stats(self.device)
        base = torch.cuda.memory_allocated(self.device)
        self._run_largest_step_and_bands()
        # After the bands too: what only their sizes allocate (fla-core's tuning buffers, say)
        # counts.
        peak = torch.cuda.max_memory_allocated(self.device) - base
        torch.cuda.empty_cache()
        budget = int(total * self.config.cache_config.gpu_memory_utilization) - used - peak
        budget -= _GRAPH_RESERVE_BYTES
        logger.info(
            "Memory: %.2f GiB used after loading, %.2f GiB activation peak, %.2f GiB for caches",
            used / 2**30, peak / 2**30, budget / 2**30,
        )  # fmt: skip
        return budget

    def _on_gpu(self) -> bool:
        return self.device.type == "cuda"

    def warm_up_prefill_steps(self) -> None:
        """On a GPU whose cache budget was given rather than profiled (`kv_cache_memory`, or the
        engine's `num_gpu_blocks_override`), run what the profiling run runs otherwise: the
        largest step, then the prefill bands (`_warm_up_prefill_bands`), on throw-away caches,
        so that the first served step of each band does not pay the tuning (9.1 s a band on a
        fresh H100). Nothing on the CPU, or where the profiling run has run them. The engine
        calls it on every rank after the cache sizing, before the caches are allocated."""
        if not self._on_gpu() or self.prefill_bands_warmed:
            return
        self._run_largest_step_and_bands()
        torch.cuda.empty_cache()

    def _run_largest_step_and_bands(self) -> None:
        """The largest step the scheduler can produce (its prefill and the logits of
        max_num_seqs rows), then `_warm_up_prefill_bands`, on throw-away caches that are
        unbound afterwards whatever happens, with the KDA prefill graphs' replays off (steps
        outside their buckets take the eager core, whose peak and tuning count)."""
        mc = self.config.model_config
        tokens = self.config.scheduler_config.max_num_batched_tokens
        seq_len = min(mc.max_model_len, tokens)
        lengths = [seq_len] * (tokens // seq_len) + ([tokens % seq_len] if tokens % seq_len else [])
        lengths = lengths[: self.max_num_seqs]
        blocks = [math.ceil(n / self.block_size) for n in lengths]
        num_blocks, num_slots = sum(blocks) + 1, len(lengths) + 1
        firsts = list(accumulate(blocks, initial=1))[:-1]
        tables = [list(range(f, f + b)) for f, b in zip(firsts, blocks, strict=True)]
        slots = list(range(1, len(lengths) + 1))
        batch = BatchSchedule([0] * len(lengths), lengths, tables, slots, 0)
        if self.prefill_graphs is not None:
            self.prefill_graphs.enabled = False
        try:
            kda, mla = allocate_kv_caches(
                self.spec, num_blocks, self.block_size, num_slots, self.device
            )
            self.model.bind_kv_caches(kda, mla)
            builder = KimiMetadataBuilder(
                sum(lengths), len(lengths), max(blocks), self.block_size, num_blocks, num_slots,
                self.device,
            )  # fmt: skip
            ids = torch.zeros(sum(lengths), dtype=torch.long, device=self.device)
            with torch.no_grad():
                hidden = self.model(ids, builder.build(batch))
                rows = hidden[: self.max_num_seqs]
                torch.softmax(self.model.compute_logits(rows).float(), dim=-1)
                del hidden, rows
                self._warm_up_prefill_bands(builder, batch, ids)
            torch.cuda.synchronize(self.device)
        finally:
            if self.prefill_graphs is not None:
                self.prefill_graphs.enabled = True
            self.model.bind_kv_caches({}, {})

    def _warm_up_prefill_bands(
        self, builder: KimiMetadataBuilder, batch: BatchSchedule, ids: torch.Tensor
    ) -> None:
        """Run the prefill steps of `warm_up_bands` up to the profiled step's tokens (a token
        fewer only below that step's), in sequences of at most its longest, on its throw-away
        caches and metadata (fewer sequences, each with the first blocks of its table): the
        eager KDA core's per-band tuning and the kernels' per-class compiles happen here, not in
        the first served step that meets them (9.1 s for one band on a fresh H100,
        docs/performance.md "Forty-first run"). One forward per 2048 tokens of the step budget:
        the largest band's top is the profiled step itself, which is not run again."""
        start = time.perf_counter()
        steps = warm_up_bands(max(batch.num_new), sum(batch.num_new), below_each=False)
        steps = [lengths for lengths in steps if lengths != batch.num_new]
        for lengths in startup_progress(steps, "Warming up prefill step sizes"):
            n = len(lengths)
            tables = [
                table[: math.ceil(length / self.block_size)]
                for table, length in zip(batch.block_tables, lengths, strict=False)
            ]
            step = BatchSchedule([0] * n, lengths, tables, batch.kda_slots[:n], 0)
            self.model(ids[: sum(lengths)], builder.build(step))
        torch.cuda.synchronize(self.device)
        self.prefill_bands_warmed = True
        logger.info("Warmed up %d prefill step sizes (up to %d tokens) in %.1f s", len(steps),
                    sum(batch.num_new), time.perf_counter() - start)  # fmt: skip

    def initialize_cache(self, num_blocks: int, num_kda_slots: int) -> None:
        try:
            kda, mla = allocate_kv_caches(
                self.spec, num_blocks, self.block_size, num_kda_slots, self.device
            )
        except RuntimeError as e:  # torch.OutOfMemoryError is one; the CPU allocator's is not
            if not isinstance(e, torch.OutOfMemoryError) and "allocate" not in str(e):
                raise
            raise CacheSizeError(
                f"{num_blocks - 1} cache blocks and {num_kda_slots - 1} KDA slots do not fit on "
                f"{self.device}: give the cache less memory or fewer blocks ({e})"
            ) from None
        self.model.bind_kv_caches(kda, mla)
        max_blocks = math.ceil(self.config.model_config.max_model_len / self.block_size)
        self.builder = KimiMetadataBuilder(
            self.max_num_tokens, self.max_num_seqs, max_blocks, self.block_size, num_blocks,
            num_kda_slots, self.device,
        )  # fmt: skip
        # Uploaded by the builder with the step's metadata, in one copy.
        self.input_ids = self.builder.input_ids

    def capture_cudagraphs(self) -> float:
        """Warm up the mixed steps (`warm_up_mixed_steps`), then capture one decode graph per
        configured batch size (largest first, one memory pool), with automatic garbage
        collection paused (`collector_paused`). Returns the seconds the capture took."""
        sizes = self.config.compilation_config.cudagraph_capture_sizes
        if not sizes or self.device.type != "cuda":
            return 0.0
        self.warm_up_mixed_steps(sizes)
        start = time.perf_counter()
        pool = torch.cuda.graph_pool_handle()
        with torch.no_grad(), collector_paused():
            for size in startup_progress(sorted(sizes, reverse=True), "Capturing decode graphs"):
                metadata = self.builder.build(BatchSchedule([], [], [], [], 0), pad_to=size)
                ids = self.input_ids[:size]
                self._logits(ids, metadata)  # warm-up: Triton compiles outside the capture
                torch.cuda.synchronize(self.device)
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph, pool=pool):
                    out = self._logits(ids, metadata)
                self.graphs[size] = (graph, out)
        torch.cuda.synchronize(self.device)
        elapsed = time.perf_counter() - start
        logger.info("Captured %d CUDA graphs (decode batch 1..%d) in %.1f s", len(sizes),
                    max(sizes), elapsed)  # fmt: skip
        return elapsed

    def warm_up_mixed_steps(self, sizes: list[int]) -> None:
        """Run one eager dummy mixed step per decode batch size in `sizes`: that many padded
        decode rows (at most max_num_seqs - 1, the most a step with a prompt holds) and a
        one-token prompt, all on the dummy block and KDA slot (`KimiMetadataBuilder.build`'s
        `dummy_prompt`), through the forward and LM head of a step, and logs the seconds it took.

        A mixed step runs its decode rows in another form than the graphs (the KDA decode
        without its norm epilogue), launched by their batch class: each class's first mixed step
        compiled that form, 293 ms for a step of about 140 ms on an H100 (docs/performance.md,
        "Mixed steps with graphs"). Every rank runs the same steps, so their collectives pair.
        """
        start = time.perf_counter()
        counts = sorted({min(size, self.max_num_seqs - 1) for size in sizes} - {0}, reverse=True)
        empty = BatchSchedule([], [], [], [], 0)
        with torch.no_grad():
            for count in startup_progress(counts, "Warming up mixed steps"):
                metadata = self.builder.build(empty, pad_to=count, dummy_prompt=1)
                self._logits(self.input_ids[: metadata.num_tokens], metadata)
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        elapsed = time.perf_counter() - start
        logger.info("Warmed up mixed steps of %d decode batch sizes (up to %d) in %.1f s",
                    len(counts), max(counts, default=0), elapsed)  # fmt: skip

    # -- one step -----------------------------------------------------------------------------

    def _logits(self, ids: torch.Tensor, metadata) -> torch.Tensor:
        return self.model.compute_logits(self.model(ids, metadata))

    def execute(self, step: StepInput) -> torch.Tensor:
        """Logits `[len(step.logits_rows), vocab]` (the LM head's dtype) of the step; every rank
        runs it."""
        n = len(step.batch.num_new)
        follows = step.input_ids is None
        tokens = n if follows else len(step.input_ids)
        if tokens > self.max_num_tokens:
            raise ValueError(f"step of {tokens} tokens exceeds the buffers ({self.max_num_tokens})")
        ids = None
        if follows:
            last = self._last_sampled_rows(n, step.batch.num_decodes)
        else:
            ids = np.array(step.input_ids, dtype=np.int64)
            bad = ids[(ids < 0) | (ids >= self.vocab_size)]
            if bad.size:
                raise ValueError(
                    f"token ids outside the vocabulary [0, {self.vocab_size}): {bad[:5].tolist()}"
                )
        graph_size = self._graph_size(step)
        with torch.no_grad():
            if graph_size is not None:
                self.builder.stage(step.batch, graph_size, ids)
            else:
                metadata = self.builder.build(step.batch, input_ids=ids)
            if follows:  # after the upload, which rewrites the whole input buffer
                self.input_ids[:n].copy_(last)
            if graph_size is not None:
                graph, out = self.graphs[graph_size]
                graph.replay()
                return out[:n]
            hidden = self.model(self.input_ids[:tokens], metadata)
            rows = step.logits_rows
            first = rows[0] if rows else 0
            if rows == list(range(first, first + len(rows))):
                # Consecutive rows (a decode-only step, one prompt's last token): a slice, no
                # index to upload.
                return self.model.compute_logits(hidden[first : first + len(rows)])
            return self.model.compute_logits(
                hidden[async_tensor_h2d(rows, torch.long, self.device)]
            )

    def _last_sampled_rows(self, n: int, num_decodes: int) -> torch.Tensor:
        """The input ids of a step without host ids: the last step's `n` sampled ids, which only
        rank 0 samples. At TP > 1 every rank runs this at the same point of the step (before its
        forward's collectives) and the others receive the ids from rank 0 on the device."""
        last = self.last_sampled if self.rank == 0 else self.received_ids[:n]
        if last is None or len(last) != n or num_decodes != n:
            raise ValueError(
                "a step without input ids must be decodes of the last sampled rows, one each"
            )
        return tensor_model_parallel_broadcast(last, src=0)

    def _graph_size(self, step: StepInput) -> int | None:
        n = len(step.batch.num_new)
        if not self.graphs or step.batch.num_decodes != n or n == 0:
            return None
        return next((size for size in sorted(self.graphs) if size >= n), None)

    # -- rank 0: from the scheduler to tokens ---------------------------------------------------

    def prepare(self, out: SchedulerOutput) -> tuple[StepInput, SamplePlan]:
        """The step's flattened batch and which logits rows sample or score prompt tokens."""
        entries, nd = out.entries, out.num_decodes
        batch = BatchSchedule(
            [e.num_computed_tokens for e in entries], [e.num_new_tokens for e in entries],
            [e.block_table for e in entries], [e.kda_slot for e in entries], nd,
        )  # fmt: skip
        ids = None if out.follows else list(chain.from_iterable([e.token_ids for e in entries]))
        # A decode is one token that samples: decode i is row i. Only prefill chunks need more.
        rows = list(range(nd))
        plan = SamplePlan([e.request for e in entries[:nd]])
        prompt_rows: list[tuple[str, list[int], list[int], int]] = []
        end = nd
        for entry in entries[nd:]:
            req = entry.request
            start, end = end, end + entry.num_new_tokens
            if entry.samples:
                rows.append(end - 1)
                plan.sample_requests.append(req)
            k = req.sampling_params.prompt_logprobs
            if k is not None:
                scored = self._prompt_positions(req, entry.num_computed_tokens, end - start)
                if scored:
                    first, last = scored
                    prompt_rows.append(
                        (
                            req.request_id,
                            list(range(start + first - entry.num_computed_tokens,
                                       start + last - entry.num_computed_tokens)),
                            req.prompt_token_ids[first + 1 : last + 1],
                            k,
                        )
                    )  # fmt: skip
        for request_id, token_rows, targets, k in prompt_rows:
            plan.prompt_slices.append((request_id, len(rows), len(token_rows), targets, k))
            rows += token_rows
        return StepInput(ids, batch, rows), plan

    def _prompt_positions(self, req, computed: int, new: int) -> tuple[int, int] | None:
        """[first, last) token positions of this chunk whose logits score a not yet scored
        prompt token (position p predicts prompt token p + 1)."""
        done = self.prompt_logprobs_done.get(req.request_id, 0)
        first = max(computed, done)
        last = min(computed + new, len(req.prompt_token_ids) - 1)
        if first >= last:
            return None
        self.prompt_logprobs_done[req.request_id] = last
        return first, last

    def sample(self, logits: torch.Tensor, plan: SamplePlan) -> SampledStep:
        """Enqueue the sampler and the copies of its results to the host; nothing here waits
        for the device (`SampledStep.result` does)."""
        reqs = plan.sample_requests
        request_ids = [req.request_id for req in reqs]
        tokens = torch.empty(0, dtype=torch.int64)
        logprobs, ks = None, [req.sampling_params.logprobs for req in reqs]
        if reqs:
            metadata = self._sampling_metadata(reqs, logits.device)
            out = self.sampler(logits[: len(reqs)], metadata)
            self.last_sampled = out.sampled_token_ids
            (tokens,) = copy_to_host((out.sampled_token_ids,))
            if out.logprobs is not None:
                lp = out.logprobs
                logprobs = copy_to_host((lp.token_ids, lp.logprobs, lp.ranks))
        prompt = []
        for request_id, first, count, targets, k in plan.prompt_slices:
            target = torch.tensor(targets, dtype=torch.long, device=logits.device)
            lp = compute_prompt_logprobs(logits[first : first + count], target, k)
            prompt.append((request_id, copy_to_host((lp.token_ids, lp.logprobs, lp.ranks))))
        ready = None
        if logits.device.type == "cuda":
            ready = torch.cuda.Event()
            ready.record()
        return SampledStep(request_ids, tokens, logprobs, ks, prompt, ready)

    def can_sample_ahead(self, reqs: list) -> bool:
        """Whether a step of the rows `reqs` can be sampled before the last step's tokens are on
        the host: when it reuses the last step's sampling metadata (the same rows, and nothing
        in it depends on their token histories)."""
        last = self._last_sampling
        return last is not None and last[0] == reqs

    def _sampling_metadata(self, reqs: list, device: torch.device) -> SamplingMetadata:
        """The last step's metadata when the rows are the same requests and it does not depend
        on their token histories (no penalty, no `min_tokens` suppression: once none is due,
        none becomes due again); else a fresh one."""
        last = self._last_sampling
        if last is not None and last[0] == reqs:
            return last[1]
        metadata = SamplingMetadata.from_requests(
            [r.sampling_params for r in reqs],
            [self._generator(r) for r in reqs],
            [r.prompt_token_ids for r in reqs],
            [r.output_token_ids for r in reqs],
            self.vocab_size,
            device,
        )
        if metadata.any_unseeded_random:
            metadata.unseeded_generator = self.unseeded_generator
        reusable = metadata.seen_mask is None and metadata.suppress_rows is None
        self._last_sampling = (reqs, metadata) if reusable else None
        return metadata

    def _generator(self, req) -> torch.Generator | None:
        seed = req.sampling_params.seed
        if seed is None:
            return None
        gen = self.generators.get(req.request_id)
        if gen is None:
            gen = torch.Generator(device=self.device).manual_seed(seed)
            self.generators[req.request_id] = gen
        return gen

    def free_requests(self, request_ids: list[str]) -> None:
        """Forget the per-request sampling state of finished requests."""
        for request_id in request_ids:
            self.generators.pop(request_id, None)
            self.prompt_logprobs_done.pop(request_id, None)
        last = self._last_sampling
        if last is not None and request_ids:
            # Rows with a finished request never come back: the cached metadata could only keep
            # those requests (their tokens, their generators) alive until the next step, or for
            # as long as the engine then stays idle.
            ended = set(request_ids)
            if any(req.request_id in ended for req in last[0]):
                self._last_sampling = None
