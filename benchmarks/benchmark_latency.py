"""Latency of a Kimi model in the engine: the decode step against its HBM floor and prefill against
the bf16 GEMM peak, per batch size and context length, all measured in one run (issue 12).

vLLM's script name and main flags (`--model`, `--load-format dummy`, `--quantization-config`,
`--batch-size`, `--input-len`, `--output-len`, `--enforce-eager`, `-tp`, `--output-json`), every
other `EngineArgs` flag, and a sweep on one loaded model (`--batch-sizes`, `--input-lens`).

For each context length L of `--input-lens`, shortest first, after a warm-up workload that compiles
every kernel (untimed):
1. one prompt of L tokens is prefilled alone, `--prefill-reps` different prompts one after
   another: the median's prefill seconds and TFLOP/s of one prompt, each prompt's seconds kept in
   the JSON (`seconds_each`); with
   `--profile-prefill` the same prefill (all its chunks) runs once more under `torch.profiler`:
   device time per kernel group (MLA prefill attention, KDA prefill, routed experts, dense GEMMs,
   other), each group against its floor (bytes at the copy bandwidth or FLOPs at the bf16 matmul
   peak, whichever is larger), and the device's busy time against the prefill's wall time;
2. B_max prompts of L tokens (B_max: the largest batch size, or the largest whose prefill fits the
   `--time-budget-s` at the rate of step 1) are added at once and stepped until every prompt is in
   the cache: the phase's seconds, tokens/s and TFLOP/s. The scheduler runs decodes first, so
   sequences prefilled early decode in the later (eager, mixed) steps; their tokens count too. If
   the phase still runs past the budget, the prompts not yet prefilled are aborted and the batch
   sizes above the sequences left are skipped;
3. for each batch size B <= B_max, largest first: the requests beyond the first B are aborted,
   `--warmup-steps` decode steps run, then `--output-len` decode steps (CUDA-graph replays unless
   `--enforce-eager`) are timed back to back, each `engine.step()` call by the host clock (with
   asynchronous scheduling, the default on a GPU, each call's time is the interval between two
   steps' tokens; `--no-async-scheduling` times them one at a time); then, one step at a time,
   `--output-len` more steps as the baseline of asynchronous scheduling (when it is on), one
   step eagerly (graphs set aside: the host's launch cost, which prefill and mixed steps
   always pay) and one more with hooks on the routers to count the distinct experts per layer;
   with `--profile-steps N`, N more steps run under `torch.profiler` (`step_profile.py`): device
   time per kernel and per group of kernels, each group against its own floor (its idle time
   between steps is that of synchronous steps).

Per case: step ms (median wall time of an `engine.step()` call: scheduling, forward, sampling,
outputs), forward ms (rank 0's forward on the device: CUDA events around the runner's execute;
launched ahead, its start waits for the step before, so host staging falls outside), tokens/s
(B / step), the floor and step / floor. Floor = the bytes a decode step must move
(`vllm/models/kimi_k3/amd/footprint.py`: weights the step uses, each distinct expert the router
chose once, KDA state read and written, the MLA latent cache at the sequences' context lengths,
averaged over the timed steps) / the eager copy bandwidth measured in the same run. Distinct experts
are measured on rank 0 unless TP > 1 and B has no graph of its own (rank 0 alone would run other
shapes): then the uniform-routing estimate E (1 - (1 - k/E)^B) is used and marked so.

Prefill TFLOP/s count 2 x active parameters x tokens: the body's active parameters for every token
processed and the LM head's for every row that samples; attention's own FLOPs (quadratic in L) are
not counted. Per GPU at TP > 1 (rank 0's shards), as are the floor bytes.

The engine is sized for the sweep unless the flags say otherwise: `--max-num-seqs` = the largest
batch, `--max-model-len` = the longest prompt + every decode token the sweep needs,
`--kv-cache-memory` = exactly the caches of that many sequences of that length (no profiling run).
CUDA graphs are captured for every decode size up to `--max-num-seqs`. Flags given explicitly that
cannot run the sweep are refused before anything is measured: `--max-num-seqs` below the largest
batch, `--max-model-len` below what the sweep needs, and (once the engine is built) cache flags
that cannot hold the largest batch at that length.

`--output-json` is rewritten whole after every case, so a run that fails keeps the cases it
measured; its `complete` is false until the run ends.

    python benchmarks/benchmark_latency.py --dry-run
    python benchmarks/benchmark_latency.py --model kimi-linear-48b-a3b --load-format dummy \\
        --skip-tokenizer-init --batch-sizes 1 8 64 256 --input-lens 1024 8192 --output-len 32 \\
        --max-num-batched-tokens 2048 --output-json latency.json
"""

import argparse
import math
import statistics
import sys
import time
from dataclasses import asdict
from typing import Any

import torch
from bench_utils import (
    DRY_RUN_MODEL,
    ForwardTimer,
    apply_dry_run,
    check_args,
    distinct_experts_of_one_step,
    engine_args,
    engine_config,
    engine_summary,
    environment,
    expected_distinct_experts,
    graphs_set_aside,
    greedy,
    is_decode_only,
    make_parser,
    measure_ceilings,
    print_table,
    random_prompts,
    run_warm_up_bands,
    size_cache,
    synchronize,
    synchronous_steps,
    timed_step,
    write_json,
)
from group_floors import (
    decode_group_floors,
    fp8_weights,
    fused_shared_experts,
    prefill_group_floors,
)
from step_profile import GAP_SPLIT_US, breakdown, profile_steps_and_gaps

from vllm.config.vllm import VllmConfig, resolve_max_num_batched_tokens
from vllm.models.kimi_k3.amd.footprint import model_footprint
from vllm.models.kimi_k3.amd.mla import KimiMLAAttention
from vllm.utils.cli import nonnegative_int, positive_float, positive_int, run_main
from vllm.v1.core.kv_cache_utils import CacheSizeError
from vllm.v1.engine.llm_engine import LLMEngine

# Seconds kept free per context length still to run, for its decode cases: (warm-up + timed + 1)
# steps per batch size, about 0.05-0.3 s each on the 48B model at batch 1-256 (a guess until
# measured; only `--time-budget-s` reads it).
DECODE_RESERVE_S = 20.0
# The batch prefill's predicted time (from the single prompt's rate) is padded by this factor.
PREFILL_MARGIN = 1.25
# Kernels listed per profiled case (the groups cover all of them).
TOP_KERNELS = 25


def decode_tokens_needed(length: int, batch: int, budget: int, cases: int, per_case: int) -> int:
    """max_tokens of each request at context `length`: the decodes its sequence may run while the
    other prompts of the batch prefill (at most one per step; each step prefills at least
    `budget - batch` tokens), then `per_case` steps for each of `cases` batch sizes, plus one."""
    prefill_steps = math.ceil(batch * length / (budget - batch)) + 1
    return prefill_steps + cases * per_case + 1


def parent_id(seq_id: str) -> str:
    """The request id of a sequence id `<request_id>#<i>`."""
    return seq_id.rsplit("#", 1)[0]


class Sweep:
    """One loaded engine, the ceilings and footprint of the run, and the record being filled."""

    def __init__(
        self, engine: LLMEngine, args: Any, record: dict[str, Any], device: torch.device,
        deadline: float,
    ) -> None:  # fmt: skip
        self.engine, self.args, self.record, self.device = engine, args, record, device
        self.deadline = deadline
        self.fp = model_footprint(engine.executor.runner.model)
        self.copy_gbps = record["ceilings"]["copy_gbps"]
        self.peak = record["ceilings"]["matmul_bf16_tflops"]
        self.vocab = engine.config.model_config.vocab_size
        record["footprint"] = asdict(self.fp) | {
            "active_params_per_token": self.fp.active_params_per_token,
            "active_params_without_lm_head": self.fp.active_params_without_lm_head,
        }
        record["prefill"], record["decode"] = [], []
        model = engine.executor.runner.model
        self.fp8_weight_bytes, self.fp8_dense_params, self.fp8_experts = fp8_weights(model)
        self.fused_shared = fused_shared_experts(model)

    # -- driving the engine ---------------------------------------------------------------------

    def run_until_idle(self) -> None:
        while self.engine.has_unfinished_requests():
            self.engine.step()

    def abort_all(self) -> None:
        sched = self.engine.scheduler
        seqs = [*sched.running, *sched.waiting]
        self.engine.abort_request(sorted({parent_id(r.request_id) for r in seqs}))

    def check_batch(self, batch: int) -> None:
        running = len(self.engine.scheduler.running)
        if running != batch or not is_decode_only(self.engine):
            raise RuntimeError(
                f"expected a decode-only step of {batch} sequences, the scheduler has {running} "
                f"running and {self.engine.scheduler.num_waiting} waiting (cache or max_tokens "
                "sized too small)"
            )

    def warm_up(self, input_lens: list[int], max_batch: int) -> None:
        """Per length, up to three prompts at once, two tokens each (prefill, mixed and decode
        steps), then one prompt alone (the single-prompt prefill's shapes), then two steps per
        band of `warm_up_bands`: kernels compiled or tuned per shape (Triton, fla's chunked KDA,
        cuDNN's attention graphs) compile here, outside every timed region. Without the lone
        prompt, the first timed 1k prefill of the 2026-12-01 run took 11.9 s instead of 0.12 s;
        without the bands, the batch phase of 256 prompts of 1k ran 33 steps of ~347 ms on a
        fresh H200 (steps of ~130 ms once tuned), fla-core tuning its q / k norm for a band of
        step sizes it first met there (9.1 s on a fresh H100)."""
        start = time.perf_counter()
        for length in input_lens:
            prompts = random_prompts(min(3, max_batch), length, self.vocab, self.args.seed)
            for i, prompt in enumerate(prompts):
                self.engine.add_request(f"warmup-{length}-{i}", prompt, greedy(2))
            self.run_until_idle()
            self.engine.add_request(f"warmup-{length}-alone", prompts[0], greedy(2))
            self.run_until_idle()
            run_warm_up_bands(self.engine, length, self.args.seed)
        self.record["warmup_s"] = time.perf_counter() - start
        print(f"warm-up (kernel compilation) {self.record['warmup_s']:.1f} s", flush=True)

    # -- measurements -----------------------------------------------------------------------------

    def add_prefill(
        self, phase: str, length: int, batch: int, tokens: int, sampled: int, seconds: float,
        **extra: Any,
    ) -> dict[str, Any]:  # fmt: skip
        """Record a prefill of `tokens` processed tokens and `sampled` LM-head rows: TFLOP/s are
        2 x (body active params x tokens + LM head params x sampled rows) / seconds. Returns the
        record's entry."""
        fp = self.fp
        flops = 2.0 * (fp.active_params_without_lm_head * tokens + fp.lm_head_params * sampled)
        tflops = flops / seconds / 1e12
        p = {
            "phase": phase, "input_len": length, "batch": batch, "tokens": tokens,
            "seconds": seconds, "tokens_per_s": tokens / seconds, "tflops": tflops,
            "pct_of_matmul_peak": 100 * tflops / self.peak, **extra,
        }  # fmt: skip
        self.record["prefill"].append(p)
        each = extra.get("seconds_each", [])
        spread = f" (median of {len(each)}: {min(each):.3f}-{max(each):.3f} s)" if each else ""
        print(
            f"L={length:>6} B={batch:>4} prefill ({phase}): {tokens} tokens in {seconds:.3f} s"
            f"{spread}, {p['tokens_per_s']:.0f} tok/s, {tflops:.1f} TFLOP/s "
            f"({p['pct_of_matmul_peak']:.1f}% of the bf16 matmul)",
            flush=True,
        )
        write_json(self.args.output_json, self.record)
        return p

    def skip(self, length: int, batches: list[int], reason: str) -> None:
        for b in batches:
            self.record["decode"].append({"input_len": length, "batch": b, "skipped": reason})
            print(f"L={length:>6} B={b:>4} skipped: {reason}", flush=True)
        write_json(self.args.output_json, self.record)

    def single_prefill(self, length: int) -> float:
        """Prefill `--prefill-reps` prompts of `length` tokens, each alone; returns the median
        seconds."""
        prompts = random_prompts(self.args.prefill_reps, length, self.vocab, self.args.seed + 1)
        each = []
        for i, prompt in enumerate(prompts):
            self.engine.add_request(f"single-{length}-{i}", prompt, greedy(1))
            synchronize(self.device)
            start = time.perf_counter()
            self.run_until_idle()
            synchronize(self.device)
            each.append(time.perf_counter() - start)
        seconds = statistics.median(each)
        entry = self.add_prefill("single prompt", length, 1, length, 1, seconds, seconds_each=each)
        if self.args.profile_prefill:
            entry["profile"] = self.profile_prefill(length)
            write_json(self.args.output_json, self.record)
        return seconds

    def profile_prefill(self, length: int) -> dict[str, Any]:
        """Prefill one more prompt of `length` tokens alone, under the profiler: device time per
        kernel group against each group's floor, the device's busy time against the wall time
        (the rest is the host: launches, scheduling, syncs) and TFLOP/s against the bf16 matmul
        peak."""
        (prompt,) = random_prompts(1, length, self.vocab, self.args.seed + 3)
        engine, fp = self.engine, self.fp
        budget = engine.config.scheduler_config.max_num_batched_tokens
        chunks = [min(budget, length - start) for start in range(0, length, budget)]
        timing: dict[str, float] = {}

        def prefill() -> None:
            engine.add_request(f"profile-{length}", prompt, greedy(1))
            synchronize(self.device)
            start, steps = time.perf_counter(), 0
            while engine.has_unfinished_requests():
                engine.step()
                steps += 1
            synchronize(self.device)
            timing["seconds"], timing["steps"] = time.perf_counter() - start, steps

        kernels, gaps = profile_steps_and_gaps(prefill, 1, self.device)
        seconds = timing["seconds"]
        device_us = sum(k.us_per_step for k in kernels)
        model = engine.executor.runner.model
        mla = [m for m in model.modules() if isinstance(m, KimiMLAAttention)]
        # Causal attention: position p attends to p + 1 keys, whatever the chunking.
        attention_flops = sum(
            2 * m.heads * (m.nope + m.rope + m.v_dim) * length * (length + 1) / 2 for m in mla
        )
        floor_flops, floor_bytes = prefill_group_floors(
            fp, length, chunks, self.fp8_dense_params, self.fp8_experts, attention_flops,
            *self.fused_shared,
        )  # fmt: skip
        groups = breakdown(kernels, 1e6 * seconds, floor_bytes, self.copy_gbps, floor_flops,
                           self.peak)  # fmt: skip
        flops = 2.0 * (fp.active_params_without_lm_head * length + fp.lm_head_params)
        tflops = flops / seconds / 1e12
        summary = {
            "input_len": length,
            "chunks": len(chunks),
            "steps": timing["steps"],
            "max_num_batched_tokens": budget,
            "seconds": seconds,
            "device_busy_s": device_us / 1e6,
            "pct_device_busy": 100 * device_us / (1e6 * seconds),
            "tflops": tflops,
            "pct_of_matmul_peak": 100 * tflops / self.peak,
            "tflops_with_attention": (flops + attention_flops) / seconds / 1e12,
            "tflops_on_device_time": flops / (device_us / 1e6) / 1e12 if device_us else None,
        }
        print_table(
            f"L={length}: device time of one prefill by kernel group ({len(chunks)} chunks of <= "
            f"{budget} tokens, {seconds:.3f} s wall, device busy {summary['pct_device_busy']:.1f}%,"
            f" {tflops:.1f} TFLOP/s = {summary['pct_of_matmul_peak']:.1f}% of the bf16 matmul)",
            [("group", "group", "s"), ("us", "us_per_step", ".0f"),
             ("% of wall", "pct_of_step", ".1f"), ("floor us", "floor_us", ".0f"),
             ("% of floor", "pct_of_floor", ".1f"), ("bound", "bound", "s")],
            groups,
        )  # fmt: skip
        if gaps is not None:
            summary["device_idle"] = asdict(gaps)
            print(
                f"L={length}: device idle in the prefill {gaps.short_us:.0f} us in "
                f"{gaps.short_count:.0f} gaps <= {GAP_SPLIT_US:.0f} us, {gaps.long_us:.0f} us in "
                f"{gaps.long_count:.0f} longer ones"
            )
            print_table(
                f"L={length}: the longer gaps by the kernels around them (the host behind)",
                [("us", "us", ".0f"), ("gaps", "count", ".0f"),
                 ("kernel before", "before", ".60s"), ("kernel after", "after", ".60s")],
                [asdict(site) for site in gaps.long_sites],
            )  # fmt: skip
        top = [asdict(k) for k in kernels[:TOP_KERNELS]]
        print_table(
            f"L={length}: top kernels of the prefill",
            [("us", "us_per_step", ".0f"), ("calls", "calls_per_step", ".0f"),
             ("group", "group", "s"), ("kernel", "name", ".90s")],
            top,
        )  # fmt: skip
        return summary | {"groups": groups, "kernels": top}

    def batch_prefill(self, length: int, batch: int, max_tokens: int, stop_at: float) -> int:
        """Prefill `batch` prompts of `length` tokens together (requests of `max_tokens` tokens,
        left running). Past `stop_at` the prompts not yet fully prefilled are aborted. Returns
        how many sequences are left running, all prefilled."""
        prompts = random_prompts(batch, length, self.vocab, self.args.seed + 2)
        for i, prompt in enumerate(prompts):
            self.engine.add_request(f"ctx{length}-{i}", prompt, greedy(max_tokens))
        sched = self.engine.scheduler
        synchronize(self.device)
        start, steps, cut = time.perf_counter(), 0, False
        while not is_decode_only(self.engine):
            if time.perf_counter() > stop_at:
                cut = True
                break
            self.engine.step()
            steps += 1
        synchronize(self.device)
        seconds = time.perf_counter() - start
        running = sched.running
        tokens = sum(r.num_computed_tokens for r in running)
        sampled = sum(len(r.output_token_ids) for r in running)
        phase = "batch (cut at the time budget)" if cut else "batch"
        self.add_prefill(phase, length, batch, tokens, sampled, seconds, steps=steps,
                         prompt_tokens=batch * length)  # fmt: skip
        unfinished = [*sched.waiting]
        unfinished += [r for r in running if r.num_computed_tokens < len(r.prompt_token_ids)]
        self.engine.abort_request(sorted({parent_id(r.request_id) for r in unfinished}))
        return len(sched.running)

    def eager_step(self, batch: int) -> float | None:
        """Seconds of one eager step of the case (graphs set aside): against the graph step, the
        host's cost of launching the forward kernel by kernel, which prefill and mixed steps
        always pay. None where rank 0 alone cannot run it eagerly: at TP > 1 the other ranks
        replay their graph of the smallest captured size >= `batch`, whose collectives match an
        eager step's only where that size is `batch` (as in `distinct_experts`)."""
        runner = self.engine.executor.runner
        tp = self.engine.config.parallel_config.tensor_parallel_size
        if not runner.graphs:
            return None  # --enforce-eager: the timed steps are eager already
        if tp > 1 and batch not in runner.graphs:
            return None  # the other ranks' padded graph would meet mismatched collectives
        with synchronous_steps(self.engine), graphs_set_aside(self.engine):
            return timed_step(self.engine)

    def distinct_experts(self, batch: int) -> tuple[list[float], str]:
        """Distinct experts per MoE layer of the next step, measured on rank 0 where every rank
        runs the same shapes (TP=1, or a graph of exactly `batch`), else the uniform estimate."""
        runner = self.engine.executor.runner
        tp = self.engine.config.parallel_config.tensor_parallel_size
        if tp == 1 or not runner.graphs or batch in runner.graphs:
            return [float(n) for n in distinct_experts_of_one_step(self.engine)], "measured"
        num_experts = self.engine.config.model_config.text_config.num_experts
        guess = expected_distinct_experts(num_experts, self.fp.top_k, batch)
        return [guess] * self.fp.num_moe_layers, "estimate"

    def decode_case(self, length: int, batch: int) -> None:
        """Time `--output-len` decode steps of the first `batch` running sequences (the others
        are aborted), then measure the experts they touch and the floor."""
        engine, args = self.engine, self.args
        running = sorted(engine.scheduler.running, key=lambda r: r.arrival_index)
        engine.abort_request([parent_id(r.request_id) for r in running[batch:]])
        for _ in range(args.warmup_steps):
            self.check_batch(batch)
            engine.step()
        self.check_batch(batch)
        first = [r.num_computed_tokens for r in engine.scheduler.running]
        timer = ForwardTimer(engine, self.device)
        try:
            # Back to back, as a serving loop steps: nothing between the steps to be timed.
            steps = [timed_step(engine) for _ in range(args.output_len)]
        finally:
            forwards = timer.close()
        # The contexts after each timed step.
        contexts = [[c + i for c in first] for i in range(1, args.output_len + 1)]
        self.check_batch(batch)
        one_at_a_time = None
        if engine.async_scheduling:
            # The baseline in the same run: the same steps without launching ahead.
            with synchronous_steps(engine):
                alone = [timed_step(engine) for _ in range(args.output_len)]
            one_at_a_time = statistics.median(alone)
            self.check_batch(batch)
        eager_s = self.eager_step(batch)
        self.check_batch(batch)
        distinct, source = self.distinct_experts(batch)
        floor_bytes = statistics.fmean(self.fp.decode_bytes(distinct, c) for c in contexts)
        floor_s = floor_bytes / (self.copy_gbps * 1e9)
        step_s, forward_s = statistics.median(steps), statistics.median(forwards)
        graphs = engine.executor.runner.graphs
        case = {
            "input_len": length,
            "batch": batch,
            "mode": "graph" if any(size >= batch for size in graphs) else "eager",
            "mean_context": statistics.fmean(sum(c) / batch for c in contexts),
            "step_ms": 1e3 * step_s,
            "step_ms_min": 1e3 * min(steps),
            "step_ms_max": 1e3 * max(steps),
            "forward_ms": 1e3 * forward_s,
            "async_scheduling": engine.async_scheduling,
            "one_at_a_time_step_ms": None if one_at_a_time is None else 1e3 * one_at_a_time,
            "eager_step_ms": None if eager_s is None else 1e3 * eager_s,
            "tokens_per_s": batch / step_s,
            "distinct_experts_mean": statistics.fmean(distinct),
            "distinct_experts": distinct,
            "distinct_experts_source": source,
            "floor_gb": floor_bytes / 1e9,
            "floor_ms": 1e3 * floor_s,
            "step_over_floor": step_s / floor_s,
            "forward_over_floor": forward_s / floor_s,
        }
        self.record["decode"].append(case)
        alone = "" if one_at_a_time is None else f", one at a time {1e3 * one_at_a_time:.2f}"
        print(
            f"L={length:>6} B={batch:>4} decode ({case['mode']}): step {case['step_ms']:.2f} ms "
            f"(forward {case['forward_ms']:.2f}{alone}), {case['tokens_per_s']:.0f} tok/s, floor "
            f"{case['floor_ms']:.2f} ms ({case['floor_gb']:.2f} GB, "
            f"{case['distinct_experts_mean']:.1f} experts/layer {source}), "
            f"step/floor {case['step_over_floor']:.2f}",
            flush=True,
        )
        if args.profile_steps:
            case["profile"] = self.profile(batch, distinct, contexts[-1], forward_s)
        write_json(args.output_json, self.record)

    def profile(
        self, batch: int, distinct: list[float], contexts: list[int], forward_s: float
    ) -> dict[str, Any]:
        """`--profile-steps` decode steps under the profiler: kernels and groups of kernels
        against the median forward time, each group against the bytes it must move."""

        def step() -> None:
            self.check_batch(batch)
            self.engine.step()

        # One at a time: every kernel in the window is one of the profiled steps'.
        with synchronous_steps(self.engine):
            kernels, gaps = profile_steps_and_gaps(step, self.args.profile_steps, self.device)
        floors = decode_group_floors(
            self.fp, distinct, contexts, self.fp8_weight_bytes, self.fused_shared[1]
        )
        groups = breakdown(kernels, 1e6 * forward_s, floors, self.copy_gbps)
        print_table(
            f"B={batch}: device time per decode step by kernel group (forward "
            f"{1e3 * forward_s:.2f} ms)",
            [("group", "group", "s"), ("us/step", "us_per_step", ".1f"),
             ("% of fwd", "pct_of_step", ".1f"), ("floor us", "floor_us", ".1f"),
             ("% of floor", "pct_of_floor", ".1f")],
            groups,
        )  # fmt: skip
        if gaps is not None:
            print(
                f"B={batch}: device idle per step {gaps.short_us:.1f} us in {gaps.short_count:.0f}"
                f" gaps <= {GAP_SPLIT_US:.0f} us (between kernels), {gaps.long_us:.1f} us in "
                f"{gaps.long_count:.0f} longer ones (waiting on the host)"
            )
        top = [asdict(k) for k in kernels[:TOP_KERNELS]]
        print_table(
            f"B={batch}: top kernels",
            [("us/step", "us_per_step", ".1f"), ("calls", "calls_per_step", ".1f"),
             ("group", "group", "s"), ("kernel", "name", ".90s")],
            top,
        )  # fmt: skip
        idle = None if gaps is None else asdict(gaps)
        return {"groups": groups, "kernels": top, "device_idle": idle}

    def run_context(self, length: int, batch_sizes: list[int], max_tokens: int, later: int) -> None:
        """Every case at context `length`; `later` context lengths still follow this one."""
        # Time kept for the decode cases of this context and of the later ones.
        stop_at = self.deadline - DECODE_RESERVE_S * (1 + later)
        if time.perf_counter() > stop_at:
            self.skip(length, batch_sizes, "no time left in --time-budget-s")
            return
        single_s = self.single_prefill(length)
        # The batch prefill takes about batch x single_s.
        room = stop_at - time.perf_counter()
        fitting = [b for b in batch_sizes if PREFILL_MARGIN * b * single_s <= room]
        late = [b for b in batch_sizes if b not in fitting]
        self.skip(length, late, "its prefill is predicted to end past --time-budget-s")
        if not fitting:
            return
        prefilled = self.batch_prefill(length, max(fitting), max_tokens, stop_at)
        cut = [b for b in fitting if b > prefilled]
        self.skip(length, cut, f"only {prefilled} prompts were prefilled within --time-budget-s")
        for batch in sorted(set(fitting) - set(cut), reverse=True):
            self.decode_case(length, batch)
        self.abort_all()


def sized_engine_config(
    parser: argparse.ArgumentParser, args: Any, batch_sizes: list[int], input_lens: list[int]
) -> tuple[VllmConfig, dict[int, int]]:
    """The engine config sized for the sweep (flags given explicitly win), built once, and each
    context's max_tokens per request."""
    bmax = max(batch_sizes)
    # `is None`: an explicit 0 is refused by the engine's check, not replaced by the default.
    seqs = bmax if args.max_num_seqs is None else args.max_num_seqs
    # The sweep's lengths, and so its max_model_len, follow from the step's token budget: the
    # engine's, resolved here as the config will resolve it. One the engine refuses (below 1) is
    # named by its check, with the other refusals, not judged here as a budget: the sweep is
    # sized by the default meanwhile.
    asked = args.max_num_batched_tokens
    if asked is not None and asked < 1:
        asked = None
    budget = resolve_max_num_batched_tokens(asked, seqs)
    if budget <= bmax:
        parser.error(f"--max-num-batched-tokens ({budget}) must exceed the largest batch ({bmax})")
    # + the one-at-a-time steps, the eager step, the routing step and the step in flight that
    # synchronous_steps completes
    per_case = args.warmup_steps + 2 * args.output_len + 3 + args.profile_steps
    max_tokens = {
        n: decode_tokens_needed(n, bmax, budget, len(batch_sizes), per_case) for n in input_lens
    }
    needed = max(n + max_tokens[n] for n in input_lens)
    max_model_len = needed if args.max_model_len is None else args.max_model_len
    ea = engine_args(args, max_num_seqs=seqs, max_model_len=max_model_len)
    config = engine_config(
        parser,
        ea,
        needed,
        "the longest prompt (--input-len/--input-lens) + the sweep's decode steps",
    )
    if seqs < bmax:
        parser.error(
            f"argument --max-num-seqs: {seqs} is below the largest batch size {bmax}, whose "
            "sequences must decode together"
        )
    size_cache(config, bmax, needed)
    return config, max_tokens


def check_cache_holds(
    parser: argparse.ArgumentParser, engine: LLMEngine, batch: int, tokens: int
) -> None:
    """A parser error (engine shut down) unless the cache holds `batch` sequences of `tokens`
    tokens at once: sized by explicit cache flags, it may hold fewer, and the sweep would only
    find out at its largest batch, after the warm-up and the prefills."""
    kv = engine.kv_cache_manager
    blocks = batch * math.ceil(tokens / kv.block_size)
    if kv.initial_num_free_blocks < blocks or kv.initial_num_free_kda_slots < batch:
        engine.shutdown()
        parser.error(
            f"the cache arguments: the sweep runs {batch} sequences of up to {tokens} tokens at "
            f"once ({blocks} MLA blocks, {batch} KDA slots); the cache has "
            f"{kv.initial_num_free_blocks} blocks and {kv.initial_num_free_kda_slots} slots "
            "(raise --num-gpu-blocks-override / --kv-cache-memory, or leave both out to size "
            "the cache for the sweep)"
        )


def main(argv: list[str] | None = None) -> int:
    parser = make_parser(__doc__)
    sweep = parser.add_argument_group("latency sweep")
    # Each single-value flag (vLLM's) or its sweep, not both: one would be ignored.
    batches = sweep.add_mutually_exclusive_group()
    batches.add_argument(
        "--batch-size",
        type=positive_int,
        default=8,
        help="sequences decoded together (default: 8)",
    )
    batches.add_argument(
        "--batch-sizes", type=positive_int, nargs="+", help="sweep these batch sizes"
    )
    lengths = sweep.add_mutually_exclusive_group()
    lengths.add_argument(
        "--input-len", type=positive_int, default=32, help="prompt tokens (default: 32)"
    )
    lengths.add_argument(
        "--input-lens", type=positive_int, nargs="+", help="sweep these prompt lengths"
    )
    sweep.add_argument(
        "--output-len", type=positive_int, default=128, help="decode steps timed per case"
    )
    sweep.add_argument(
        "--warmup-steps",
        type=nonnegative_int,
        default=2,
        help="untimed decode steps before each case",
    )
    sweep.add_argument(
        "--profile-steps",
        type=nonnegative_int,
        default=0,
        help="after each case, profile this many more decode steps: device time per kernel and "
        "per kernel group against each group's floor (0: no profile)",
    )
    sweep.add_argument(
        "--prefill-reps",
        type=positive_int,
        default=3,
        help="prompts prefilled one after another (each alone) for a context's single-prompt "
        "figure, which is their median",
    )
    sweep.add_argument(
        "--profile-prefill",
        action="store_true",
        help="after each single-prompt prefill, prefill the prompt once more under the profiler: "
        "device time per kernel group against each group's floor, and TFLOP/s",
    )
    sweep.add_argument(
        "--copy-gib",
        type=positive_float,
        default=2.0,
        help="size of the eager copy_ ceiling (>= 1 GiB)",
    )
    sweep.add_argument(
        "--matmul-size",
        type=positive_int,
        default=8192,
        help="n of the n x n x n bf16 matmul ceiling",
    )
    sweep.add_argument(
        "--time-budget-s",
        type=positive_float,
        default=None,
        help="wall seconds for the whole run (engine start included): at each context the batch "
        "prefill is cut to what fits, keeping 20 s per context for its decode cases; cases cut "
        "are reported as skipped",
    )
    args = parser.parse_args(argv)
    device = check_args(parser, args)
    if args.dry_run:
        apply_dry_run(
            parser, args, model=DRY_RUN_MODEL, load_format="dummy", skip_tokenizer_init=True,
            tokenizer=None, device="cpu", dtype="auto", copy_gib=1 / 64, matmul_size=256,
            batch_sizes=[1, 2], input_lens=[8, 20], batch_size=1, input_len=8, output_len=2,
            warmup_steps=1, max_num_batched_tokens=16, profile_steps=1, profile_prefill=True,
            max_num_seqs=None, max_model_len=None, kv_cache_memory=None,
            num_gpu_blocks_override=None,
            # Off by default on the CPU; on here so that the dry run goes through its code.
            async_scheduling=True,
        )  # fmt: skip
    batch_sizes = sorted(set(args.batch_sizes or [args.batch_size]))
    input_lens = sorted(set(args.input_lens or [args.input_len]))
    if args.copy_gib < 1 and not args.dry_run:
        # A smaller copy partly hits the 50 MB L2 and overstates the HBM bandwidth.
        parser.error(f"argument --copy-gib: must be at least 1, got {args.copy_gib}")
    start = time.perf_counter()
    deadline = start + args.time_budget_s if args.time_budget_s else math.inf
    config, max_tokens = sized_engine_config(parser, args, batch_sizes, input_lens)

    # Written after each case so that a crash keeps what was measured; "complete" says whether
    # the run got to its end.
    record: dict[str, Any] = {"benchmark": "latency", "complete": False}
    record["environment"] = environment(device)
    record["args"] = vars(args)
    record["ceilings"] = c = measure_ceilings(device, args.copy_gib, args.matmul_size)
    print(
        f"{record['environment']['device']}: eager copy_ of {args.copy_gib:g} GiB "
        f"{c['copy_gbps']:.0f} GB/s; bf16 matmul {args.matmul_size}^3 "
        f"{c['matmul_bf16_tflops']:.1f} TFLOP/s",
        flush=True,
    )
    t0 = time.perf_counter()
    try:
        engine = LLMEngine(config)
    except CacheSizeError as e:  # --num-gpu-blocks-override / --kv-cache-memory too small
        parser.error(f"the cache arguments: {e}")
    needed = max(n + tokens for n, tokens in max_tokens.items())
    check_cache_holds(parser, engine, max(batch_sizes), needed)
    record["engine_start_s"] = time.perf_counter() - t0
    record["engine"] = engine_summary(engine)
    try:
        run = Sweep(engine, args, record, device, deadline)
        print(
            f"engine ready in {record['engine_start_s']:.1f} s; {run.fp.total_params / 1e9:.2f} B"
            f" params, {run.fp.active_params_per_token / 1e9:.3f} B active per token (LM head "
            "included)",
            flush=True,
        )
        run.warm_up(input_lens, max(batch_sizes))
        for index, length in enumerate(input_lens):
            run.run_context(length, batch_sizes, max_tokens[length], len(input_lens) - index - 1)
    finally:
        engine.shutdown()
    record["total_s"] = time.perf_counter() - start
    record["complete"] = True
    write_json(args.output_json, record)
    print_summary(record)
    return 0


def print_summary(record: dict[str, Any]) -> None:
    env, c = record["environment"], record["ceilings"]
    print(
        f"\n{env['device']}, torch {env['torch']}, triton {env['triton']}, fla-core "
        f"{env['fla-core']}; copy {c['copy_gbps']:.0f} GB/s, bf16 matmul "
        f"{c['matmul_bf16_tflops']:.1f} TFLOP/s; engine start {record['engine_start_s']:.1f} s, "
        f"total {record['total_s']:.1f} s"
    )
    prefill = [("ctx", "input_len", "d"), ("batch", "batch", "d"), ("phase", "phase", "s"),
               ("tokens", "tokens", "d"), ("s", "seconds", ".2f"),
               ("tok/s", "tokens_per_s", ".0f"), ("TFLOP/s", "tflops", ".1f"),
               ("% peak", "pct_of_matmul_peak", ".1f")]  # fmt: skip
    print_table("prefill", prefill, record["prefill"])
    decode = [("ctx", "input_len", "d"), ("batch", "batch", "d"), ("mode", "mode", "s"),
              ("mean ctx", "mean_context", ".0f"), ("step ms", "step_ms", ".2f"),
              ("fwd ms", "forward_ms", ".2f"), ("1-by-1 ms", "one_at_a_time_step_ms", ".2f"),
              ("eager ms", "eager_step_ms", ".2f"),
              ("tok/s", "tokens_per_s", ".0f"),
              ("experts", "distinct_experts_mean", ".1f"), ("floor GB", "floor_gb", ".2f"),
              ("floor ms", "floor_ms", ".2f"), ("step/flr", "step_over_floor", ".2f"),
              ("fwd/flr", "forward_over_floor", ".2f")]  # fmt: skip
    print_table("decode", decode, record["decode"])


if __name__ == "__main__":
    sys.exit(run_main(main))
