"""Stat loggers of the engine loop: Prometheus metrics for `/metrics` and a periodic log line.

Both run on the engine thread (`AsyncLLM` calls `record` after every loop iteration). Metric names
follow upstream's `vllm:` prefix; the cache counters (`vllm:num_free_blocks`, ...) are this fork's
own, so that a test or an operator can check that the cache returns to its initial state.
"""

import time
from collections import deque

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from vllm.logger import init_logger
from vllm.v1.engine.async_llm import IterationStats, SchedulerStats, StatLogger

logger = init_logger(__name__)

_TTFT_BUCKETS = (
    0.005,
    0.01,
    0.02,
    0.04,
    0.06,
    0.08,
    0.1,
    0.25,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
    160.0,
    640.0,
)
_TPOT_BUCKETS = (
    0.001,
    0.005,
    0.01,
    0.015,
    0.02,
    0.025,
    0.03,
    0.04,
    0.05,
    0.075,
    0.1,
    0.15,
    0.2,
    0.3,
    0.4,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
)
_E2E_BUCKETS = (
    0.3,
    0.5,
    0.8,
    1.0,
    1.5,
    2.0,
    2.5,
    5.0,
    10.0,
    15.0,
    20.0,
    30.0,
    40.0,
    50.0,
    60.0,
    120.0,
    240.0,
    480.0,
    960.0,
    1920.0,
    7680.0,
)
# The finish reasons a request can end with (`Request.finish_reason`).
_FINISH_REASONS = ("stop", "length", "abort", "error")
# Window of the tokens/s gauges.
_THROUGHPUT_WINDOW_S = 10.0


class _Throughput:
    """Tokens per second over the last `_THROUGHPUT_WINDOW_S` seconds (over the time since `start`
    while that is shorter): the tokens counted in the window over the window's length, not over
    the time since the window's first tokens (which made a lone burst read as a high rate)."""

    def __init__(self, start: float) -> None:
        self._start = start
        self._events: deque[tuple[float, int, int]] = deque()

    def add(self, now: float, prompt: int, generation: int) -> tuple[float, float]:
        if prompt or generation:
            self._events.append((now, prompt, generation))
        while self._events and self._events[0][0] <= now - _THROUGHPUT_WINDOW_S:
            self._events.popleft()
        if not self._events:
            return 0.0, 0.0
        span = min(now - self._start, _THROUGHPUT_WINDOW_S)
        if span <= 0:
            return 0.0, 0.0
        return (
            sum(e[1] for e in self._events) / span,
            sum(e[2] for e in self._events) / span,
        )


class _WithoutCreated:
    """A registry's metric families, less their `_created` samples."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self._registry = registry

    def collect(self):
        for family in self._registry.collect():  # fresh families at every collect
            family.samples = [s for s in family.samples if not s.name.endswith("_created")]
            yield family


class PrometheusStatLogger(StatLogger):
    """The server's metrics, in a registry of their own (one per app, so tests can build many)."""

    def __init__(self, model_name: str) -> None:
        self.registry = CollectorRegistry()
        labels = {"model_name": model_name}

        def gauge(name: str, doc: str) -> Gauge:
            return Gauge(name, doc, list(labels), registry=self.registry).labels(**labels)

        def histogram(name: str, doc: str, buckets: tuple[float, ...]) -> Histogram:
            metric = Histogram(name, doc, list(labels), buckets=buckets, registry=self.registry)
            return metric.labels(**labels)

        self.running = gauge("vllm:num_requests_running", "Requests running on the engine.")
        self.waiting = gauge("vllm:num_requests_waiting", "Requests waiting (preempted included).")
        self.kv_usage = gauge("vllm:kv_cache_usage_perc", "Fraction of MLA cache blocks in use.")
        self.free_blocks = gauge("vllm:num_free_blocks", "Free MLA cache blocks.")
        self.initial_free_blocks = gauge(
            "vllm:initial_num_free_blocks", "Free MLA cache blocks with no request running."
        )
        self.free_slots = gauge("vllm:num_free_kda_slots", "Free KDA state slots.")
        self.initial_free_slots = gauge(
            "vllm:initial_num_free_kda_slots", "Free KDA state slots with no request running."
        )
        self.prompt_tps = gauge(
            "vllm:avg_prompt_throughput_toks_per_s", "Prompt tokens/s over the last 10 s."
        )
        self.generation_tps = gauge(
            "vllm:avg_generation_throughput_toks_per_s", "Generated tokens/s over the last 10 s."
        )
        self.prompt_tokens = Counter(
            "vllm:prompt_tokens", "Prefilled prompt tokens.", list(labels), registry=self.registry
        ).labels(**labels)
        self.generation_tokens = Counter(
            "vllm:generation_tokens", "Generated tokens.", list(labels), registry=self.registry
        ).labels(**labels)
        self.request_success = Counter(
            "vllm:request_success",
            "Finished requests by finish reason.",
            [*labels, "finished_reason"],
            registry=self.registry,
        )
        # Every reason's series exists from the start, at 0 (as upstream's): a fresh server
        # exposes the counter, and a query on one reason reads 0 rather than no data.
        for reason in _FINISH_REASONS:
            self.request_success.labels(**labels, finished_reason=reason)
        self.ttft = histogram(
            "vllm:time_to_first_token_seconds", "Time to first token.", _TTFT_BUCKETS
        )
        self.tpot = histogram(
            "vllm:time_per_output_token_seconds",
            "Time per output token after the first, per completion (each of n).",
            _TPOT_BUCKETS,
        )
        self.e2e = histogram(
            "vllm:e2e_request_latency_seconds",
            "Request latency, arrival to finish.",
            _E2E_BUCKETS,
        )
        self._labels = labels
        self._throughput = _Throughput(time.monotonic())

    def exposition(self) -> bytes:
        """The metrics in the Prometheus text format, for `/metrics`.

        Without the `_created` samples that prometheus_client adds to every counter and histogram
        (upstream's /metrics has none): each is exposed as a gauge of its own, e.g.
        `vllm:generation_tokens_created 1.7e+09`, a timestamp that reads like a token count."""
        return generate_latest(_WithoutCreated(self.registry))

    def record(self, scheduler: SchedulerStats, iteration: IterationStats | None) -> None:
        self.running.set(scheduler.num_running)
        self.waiting.set(scheduler.num_waiting)
        self.kv_usage.set(scheduler.kv_cache_usage)
        self.free_blocks.set(scheduler.num_free_blocks)
        self.initial_free_blocks.set(scheduler.initial_num_free_blocks)
        self.free_slots.set(scheduler.num_free_kda_slots)
        self.initial_free_slots.set(scheduler.initial_num_free_kda_slots)
        it = iteration or IterationStats()
        prompt_tps, generation_tps = self._throughput.add(
            time.monotonic(), it.num_prompt_tokens, it.num_generation_tokens
        )
        self.prompt_tps.set(prompt_tps)
        self.generation_tps.set(generation_tps)
        self.prompt_tokens.inc(it.num_prompt_tokens)
        self.generation_tokens.inc(it.num_generation_tokens)
        for value in it.time_to_first_token:
            self.ttft.observe(value)
        for value in it.time_per_output_token:
            self.tpot.observe(value)
        for reason, latency in it.finished:
            self.request_success.labels(**self._labels, finished_reason=reason).inc()
            self.e2e.observe(latency)


class LoggingStatLogger(StatLogger):
    """Logs throughput, load and cache usage every `interval` seconds while there is traffic."""

    def __init__(self, interval: float = 10.0) -> None:
        self.interval = interval
        self._last = time.monotonic()
        self._prompt = 0
        self._generation = 0
        self._logged_idle = True

    def record(self, scheduler: SchedulerStats, iteration: IterationStats | None) -> None:
        if iteration is not None:
            self._prompt += iteration.num_prompt_tokens
            self._generation += iteration.num_generation_tokens
        now = time.monotonic()
        if now - self._last < self.interval:
            return
        idle = not (self._prompt or self._generation or scheduler.num_running)
        if not (idle and self._logged_idle):
            span = now - self._last
            logger.info(
                "Avg prompt throughput: %.1f tokens/s, Avg generation throughput: %.1f tokens/s, "
                "Running: %d reqs, Waiting: %d reqs, KV cache usage: %.1f%%",
                self._prompt / span,
                self._generation / span,
                scheduler.num_running,
                scheduler.num_waiting,
                100 * scheduler.kv_cache_usage,
            )
        self._logged_idle = idle
        self._last, self._prompt, self._generation = now, 0, 0
