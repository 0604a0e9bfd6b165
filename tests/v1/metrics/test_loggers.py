"""The stat loggers over a controlled clock: the throughput gauges of /metrics and the periodic
log line give the tokens counted over their window or interval, divided by its length."""

import logging
import re
from pathlib import Path

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from vllm.v1.engine.async_llm import IterationStats, SchedulerStats
from vllm.v1.metrics import loggers
from vllm.v1.metrics.loggers import LoggingStatLogger, PrometheusStatLogger


class _Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> _Clock:
    clock = _Clock()
    monkeypatch.setattr(loggers.time, "monotonic", clock)
    return clock


def _gauge(metrics: PrometheusStatLogger, name: str) -> float:
    for line in generate_latest(metrics.registry).decode().splitlines():
        if line.startswith(name + "{"):
            return float(line.rsplit(" ", 1)[1])
    raise KeyError(name)


def test_throughput_gauges_average_over_the_last_10_s(clock: _Clock) -> None:
    metrics = PrometheusStatLogger("m")
    clock.now += 60  # the server has been up a while, idle
    metrics.record(SchedulerStats(), None)
    # One burst: 500 prompt and 200 generated tokens within one second, then nothing.
    for _ in range(4):
        clock.now += 0.25
        metrics.record(SchedulerStats(), IterationStats(125, 50))
    burst_end = clock.now
    # Over the last 10 s: 500 / 10 and 200 / 10 while the burst is in the window, then 0.
    for seconds_later, in_window in ((0.0, True), (5.0, True), (8.9, True), (10.0, False)):
        clock.now = burst_end + seconds_later
        metrics.record(SchedulerStats(), None)
        prompt = _gauge(metrics, "vllm:avg_prompt_throughput_toks_per_s")
        generation = _gauge(metrics, "vllm:avg_generation_throughput_toks_per_s")
        assert (prompt, generation) == ((50.0, 20.0) if in_window else (0.0, 0.0)), seconds_later


def test_throughput_gauges_average_since_start_in_the_first_10_s(clock: _Clock) -> None:
    metrics = PrometheusStatLogger("m")
    clock.now += 4.0
    metrics.record(SchedulerStats(), IterationStats(0, 100))
    assert _gauge(metrics, "vllm:avg_generation_throughput_toks_per_s") == 25.0


class _Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


def test_log_line_gives_the_interval_s_tokens_over_its_length(clock: _Clock) -> None:
    stats_logger = LoggingStatLogger(interval=10.0)
    log, handler = logging.getLogger(loggers.__name__), _Lines()
    log.addHandler(handler)
    try:
        for _ in range(4):  # 12 s of traffic, 30 prompt and 36 generated tokens a step
            clock.now += 3.0
            stats_logger.record(SchedulerStats(num_running=2), IterationStats(30, 36))
        clock.now += 10.0  # one idle line, then silence
        stats_logger.record(SchedulerStats(), None)
        clock.now += 10.0
        stats_logger.record(SchedulerStats(), None)
    finally:
        log.removeHandler(handler)
    lines = handler.lines
    assert len(lines) == 2, lines
    # The first line at 12 s: 4 steps' tokens over 12 s.
    assert lines[0].startswith(
        "Avg prompt throughput: 10.0 tokens/s, Avg generation throughput: 12.0 tokens/s, "
        "Running: 2 reqs"
    )
    assert lines[1].startswith(
        "Avg prompt throughput: 0.0 tokens/s, Avg generation throughput: 0.0"
    )


def test_exposition_has_the_documented_metrics_and_no_created_series() -> None:
    """/metrics exposes exactly the metrics docs/serving.md lists (counters by their `_total`
    name), with no `_created` timestamp gauges beside them (`vllm:generation_tokens_created
    1.7e+09` reads like a token count; upstream exposes none)."""
    metrics = PrometheusStatLogger("m")
    metrics.record(SchedulerStats(), IterationStats(3, 4, [0.1], [0.01], [("stop", 1.0)]))
    text = metrics.exposition().decode()
    exposed = set()
    for family in text_string_to_metric_families(text):
        exposed.add(family.name + "_total" if family.type == "counter" else family.name)
    assert not [line for line in text.splitlines() if "_created" in line]
    doc = (Path(__file__).parents[3] / "docs" / "serving.md").read_text()
    section = doc.split("## Metrics", 1)[1].split("\n## ", 1)[0]
    assert exposed == set(re.findall(r"`(vllm:[a-z0-9_]+)", section))


def test_request_success_has_every_finish_reason_from_the_start() -> None:
    """As upstream, each finish reason's series is exposed at 0 before any request ends with it:
    a fresh server shows `vllm:request_success_total` (not "no data"), and a query or alert on
    one reason (`finished_reason="length"`) reads 0 rather than nothing."""
    metrics = PrometheusStatLogger("m")
    (family,) = [
        f
        for f in text_string_to_metric_families(metrics.exposition().decode())
        if f.name == "vllm:request_success"
    ]
    counts = {s.labels["finished_reason"]: s.value for s in family.samples}
    assert counts == {"stop": 0.0, "length": 0.0, "abort": 0.0, "error": 0.0}
