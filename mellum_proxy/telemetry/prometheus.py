"""`ProxyMetrics`: Prometheus exposition for `GET /metrics`, on a registry the app owns.

Names follow vLLM's style (`vllm:time_to_first_token_seconds`) with the prefix `mellum_proxy_`.
Gauges read live state through callbacks, so nothing on the request path updates them.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from prometheus_client.registry import Collector

from mellum_proxy.models import Outcome
from mellum_proxy.telemetry.record import RequestRecord

CONTENT_TYPE = CONTENT_TYPE_LATEST
_LATENCY_BUCKETS = (0.025, 0.05, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 5.0, 10.0, 30.0)


class ProxyMetrics:
    """Args: live gauges as callables (`inflight`, `queued`, GPU `used`/`total` bytes or None)."""

    def __init__(
        self,
        inflight: Callable[[], int],
        queued: Callable[[], int],
        gpu_used: Callable[[], int | None],
        gpu_total: Callable[[], int | None],
        log_errors: Callable[[], int] = lambda: 0,
        log_dropped: Callable[[], int] = lambda: 0,
        upstreams: Callable[[], list[dict[str, Any]]] = list,
        lanes: Callable[[], dict[str, tuple[int, int]]] = dict,
    ) -> None:
        """`lanes`: each lane's (requests upstream, requests waiting) now."""
        self.registry = CollectorRegistry()
        r = self.registry
        self.ttft = Histogram(
            "mellum_proxy_time_to_first_token_seconds",
            "Arrival at the proxy to first token.",
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.duration = Histogram(
            "mellum_proxy_request_duration_seconds",
            "Arrival to last byte, any outcome.",
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.queue_wait = Histogram(
            "mellum_proxy_queue_wait_seconds", "Wait for an upstream slot.", buckets=_LATENCY_BUCKETS, registry=r
        )
        self.requests = Counter(
            "mellum_proxy_requests", "Client completion requests by outcome.", ["outcome"], registry=r
        )
        self.suggestions = Counter(
            "mellum_proxy_suggestions_judged",
            "Shown suggestions whose fate the session's next requests settled.",
            registry=r,
        )
        self.suggestions_accepted = Counter(
            "mellum_proxy_suggestions_accepted",
            "Judged suggestions of which the person kept a character or more.",
            registry=r,
        )
        self.accepted_chars = Counter(
            "mellum_proxy_accepted_chars", "Characters of the shown suggestions the person kept.", registry=r
        )
        self.draft_tokens = Counter(
            "mellum_proxy_draft_tokens", "Tokens the server's speculation drafted (llama.cpp's timings).", registry=r
        )
        self.draft_tokens_accepted = Counter(
            "mellum_proxy_draft_tokens_accepted", "Drafted tokens the model accepted.", registry=r
        )
        # every outcome is visible from the start, at 0; the children are looked up once
        self._by_outcome = {outcome: self.requests.labels(outcome.value) for outcome in Outcome}
        Gauge("mellum_proxy_inflight_requests", "Requests upstream now.", registry=r).set_function(inflight)
        Gauge("mellum_proxy_queued_requests", "Requests waiting for a slot.", registry=r).set_function(queued)
        Gauge("mellum_proxy_gpu_memory_used_bytes", "GPU memory used (NaN without NVML).", registry=r).set_function(
            _or_nan(gpu_used)
        )
        Gauge("mellum_proxy_gpu_memory_total_bytes", "GPU memory total (NaN without NVML).", registry=r).set_function(
            _or_nan(gpu_total)
        )

        self.lane_wait = Histogram(
            "mellum_proxy_lane_wait_seconds", "Wait for an upstream slot, by lane.", ["lane"],
            buckets=_LATENCY_BUCKETS, registry=r,
        )  # fmt: skip
        self.bulk_requests = Counter(
            "mellum_proxy_bulk_requests", "Bulk requests (chat, agents) passed through, by outcome.", ["outcome"],
            registry=r,
        )  # fmt: skip
        r.register(_LaneGauges(lanes))
        r.register(_LogCounters(log_errors, log_dropped))
        r.register(_UpstreamMetrics(upstreams))

    def observe(self, record: RequestRecord) -> None:
        self._by_outcome[record.outcome or Outcome.CLIENT_GONE].inc()
        if record.ttft_ms is not None:
            self.ttft.observe(record.ttft_ms / 1000)
        if record.total_ms is not None:
            self.duration.observe(record.total_ms / 1000)
        if record.queue_ms is not None:
            self.queue_wait.observe(record.queue_ms / 1000)
            self.lane_wait.labels("completion").observe(record.queue_ms / 1000)
        if record.draft_n:
            self.draft_tokens.inc(record.draft_n)
            self.draft_tokens_accepted.inc(record.draft_n_accepted or 0)

    def observe_bulk(self, record: RequestRecord) -> None:
        self.bulk_requests.labels(str(record.outcome or Outcome.CLIENT_GONE)).inc()
        if record.queue_ms is not None:
            self.lane_wait.labels("bulk").observe(record.queue_ms / 1000)

    def accepted(self, accepted_chars: int) -> None:
        """One judged suggestion (`mellum_proxy.telemetry.acceptance`)."""
        self.suggestions.inc()
        if accepted_chars:
            self.suggestions_accepted.inc()
            self.accepted_chars.inc(accepted_chars)

    def render(self) -> bytes:
        return generate_latest(self.registry)


class _LaneGauges(Collector):
    """Each lane's requests upstream and waiting, read from the admission queue when scraped."""

    def __init__(self, lanes: Callable[[], dict[str, tuple[int, int]]]) -> None:
        self.lanes = lanes

    def collect(self) -> Iterator[GaugeMetricFamily]:
        running = GaugeMetricFamily("mellum_proxy_lane_inflight_requests", "Requests upstream now, by lane.",
                                    labels=["lane"])  # fmt: skip
        waiting = GaugeMetricFamily("mellum_proxy_lane_queued_requests", "Requests waiting for a slot, by lane.",
                                    labels=["lane"])  # fmt: skip
        for lane, (upstream, queued) in self.lanes().items():
            running.add_metric([lane], upstream)
            waiting.add_metric([lane], queued)
        yield running
        yield waiting


class _LogCounters(Collector):
    """The request log's failed writes and dropped lines, read from the log itself when scraped."""

    def __init__(self, errors: Callable[[], int], dropped: Callable[[], int]) -> None:
        self.errors, self.dropped = errors, dropped

    def collect(self) -> Iterator[CounterMetricFamily]:
        yield CounterMetricFamily("mellum_proxy_log_errors", "Failed request-log writes.", value=self.errors())
        yield CounterMetricFamily(
            "mellum_proxy_log_dropped", "Request-log lines dropped while it could not be written.", value=self.dropped()
        )


class _UpstreamMetrics(Collector):
    """Per upstream (`Upstreams.status()`): completions served and failed over, whether it is up and serving."""

    def __init__(self, upstreams: Callable[[], list[dict[str, Any]]]) -> None:
        self.upstreams = upstreams

    def collect(self) -> Iterator[CounterMetricFamily | GaugeMetricFamily]:
        members = self.upstreams()
        requests = CounterMetricFamily(
            "mellum_proxy_upstream_requests", "Completions per upstream: served, or failed before their first token "
            "(and sent on to the next upstream).", labels=["upstream", "result"],
        )  # fmt: skip
        up = GaugeMetricFamily("mellum_proxy_upstream_up", "1 while the upstream is up.", labels=["upstream"])
        serving = GaugeMetricFamily(
            "mellum_proxy_upstream_serving", "1 for the upstream serving now.", labels=["upstream"]
        )
        for member in members:
            requests.add_metric([member["url"], "served"], member["served"])
            requests.add_metric([member["url"], "failed"], member["failed"])
            up.add_metric([member["url"]], 1.0 if member["up"] else 0.0)
            serving.add_metric([member["url"]], 1.0 if member["serving"] else 0.0)
        yield from (requests, up, serving)


def _or_nan(read: Callable[[], int | None]) -> Callable[[], float]:
    def value() -> float:
        number = read()
        return math.nan if number is None else float(number)

    return value
