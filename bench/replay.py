"""`mellum-proxy bench replay`: the same typing, the same server, one policy after another.

Each policy is a set of proxy settings (`debounce_ms`, `max_inflight`, `timeout_ms`, ...) plus the
simulated plugin's own options (`plugin_cancel`, `plugin_debounce_ms`); `direct` sends the plugin's
requests straight to the upstream, the baseline everyone has today. Every policy gets a fresh proxy
in-process and a short warm-up; events replay in real time, with gaps longer than `max_gap_ms` shortened
to it (a pause stays a pause). What the upstream did is read from its own `/metrics` (llama.cpp's names;
the simulator speaks them too).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import aiohttp
from aiohttp import web

from bench.editor import EditMark, Plugin, account
from bench.trace import Documents, Edit, Event, next_typed
from proxy.config import Settings
from proxy.http import POLICIES, RECORDS, build_app, serve_app
from proxy.telemetry import RecentRecords

PLUGIN_KEYS = {"plugin_cancel", "plugin_debounce_ms"}


@dataclass(frozen=True)
class Policy:
    name: str
    settings: dict[str, str] | None  # None: direct to the upstream
    plugin_cancel: bool = True
    plugin_debounce_ms: float = 0


def parse_policy(text: str) -> Policy:
    """`NAME[:key=value,...]`; a NAME of `direct` or `direct-...` is the no-proxy baseline.

    Raises:
        ValueError: malformed, or a setting the proxy does not have.
    """
    name, _, rest = text.partition(":")
    options: dict[str, str] = {}
    for part in filter(None, (p.strip() for p in rest.split(","))):
        key, sep, value = part.partition("=")
        if not sep:
            raise ValueError(f"policy '{text}': expected key=value, got '{part}'")
        options[key.strip()] = value.strip()
    cancel = options.pop("plugin_cancel", "true").lower() not in ("false", "0", "no")
    debounce = float(options.pop("plugin_debounce_ms", "0"))
    if name == "direct" or name.startswith("direct-"):
        if options:
            raise ValueError(f"policy '{text}': direct takes only plugin_* options")
        return Policy(name, None, cancel, debounce)
    unknown = set(options) - set(Settings.model_fields)
    if unknown:
        raise ValueError(f"policy '{text}': unknown proxy setting(s) {', '.join(sorted(unknown))}")
    return Policy(name, options, cancel, debounce)


async def read_metrics(session: aiohttp.ClientSession, url: str) -> dict[str, float]:
    try:
        async with session.get(url + "/metrics", timeout=aiohttp.ClientTimeout(total=2)) as resp:
            text = await resp.text()
    except (aiohttp.ClientError, TimeoutError):
        return {}
    values = {}
    for line in text.splitlines():
        if line.startswith("llamacpp:"):
            name, _, value = line.partition(" ")
            with contextlib.suppress(ValueError):
                values[name.removeprefix("llamacpp:")] = float(value)
    return values


@contextlib.asynccontextmanager
async def proxy_for(policy: Policy, upstream: str) -> AsyncIterator[tuple[str, web.Application | None]]:
    """The URL the plugin talks to: the upstream itself (direct) or a fresh in-process proxy."""
    if policy.settings is None:
        yield upstream, None
        return
    settings = Settings.model_validate({"upstream": upstream, **policy.settings})  # a policy may name its own
    app = build_app(settings)
    app[RECORDS] = RecentRecords(size=1 << 20)  # every record of the replay, not only the last 256
    async with serve_app(app) as url:
        yield url, app


def schedule(events: list[Event], max_gap_ms: float) -> list[float]:
    """Replay times: gaps longer than `max_gap_ms` shortened to it."""
    times, last_in, last_out = [], None, 0.0
    for event in events:
        if last_in is None:
            out = 0.0
        else:
            out = last_out + min(event.t_ms - last_in, max_gap_ms)
        times.append(out)
        last_in, last_out = event.t_ms, out
    return times


@dataclass
class PolicyResult:
    policy: str
    edits: int
    client_requests: int
    upstream_requests: int
    shown: int
    pauses: int
    pause_coverage: float | None
    latency_p50_ms: float | None
    latency_p95_ms: float | None
    upstream_prompt_tokens: float | None
    upstream_completion_tokens: float | None
    shown_completion_tokens: int
    wasted_completion_tokens: float | None
    timeouts: int
    errors: int
    max_queue_depth: int
    max_inflight: int
    vram_peak_mib: float | None
    duration_s: float
    idle_wait_s: float | None = None  # how long the server took to be idle before this policy began
    predicted_chars: int | None = None  # of what the person typed next, how much the shown suggestions had
    served_by: dict[str, int] = field(default_factory=dict)  # upstream requests answered, per upstream
    upstream_errors: int = 0  # completions the proxy answered with an upstream error
    record_prompt_tokens: int = 0  # prompt tokens of the answered requests (their usage)
    record_cached_tokens: int = 0  # of which the server reused from its cache
    # (arrival unix s, upstream that answered, outcome, total ms) of each request that reached the upstream
    upstream_series: list[tuple[float, str | None, str, float]] = field(default_factory=list)
    inflight_series: list[tuple[float, float, float]] = field(default_factory=list)  # (s, running, queued)
    latencies_ms: list[float] = field(default_factory=list)

    def summary(self) -> dict[str, Any]:
        data = asdict(self)
        data.pop("inflight_series")
        data.pop("latencies_ms")
        data.pop("upstream_series")
        return data


async def run_policy(
    policy: Policy,
    events: list[Event],
    upstream: str,
    pause_ms: float = 300,
    max_gap_ms: float = 2000,
    max_tokens: int = 64,
    progress: Callable[[int, int], None] | None = None,
) -> PolicyResult:
    times = schedule(events, max_gap_ms)
    async with aiohttp.ClientSession() as session:
        idle_wait_s = await wait_idle(session, upstream)
    async with aiohttp.ClientSession() as session, proxy_for(policy, upstream) as (url, app):
        plugin = Plugin(session, url + "/v1/completions", cancels=policy.plugin_cancel,
                        debounce_ms=policy.plugin_debounce_ms, max_tokens=max_tokens)  # fmt: skip
        await _warm_up(plugin, events)
        before = await read_metrics(session, upstream)
        samples: list[tuple[float, float, float]] = []
        sampler = asyncio.create_task(_sample(session, upstream, plugin, samples))
        documents, marks = Documents(), []
        plugin.started = time.monotonic()
        plugin.results.clear()
        loop_start = asyncio.get_running_loop().time()
        for position, (event, at) in enumerate(zip(events, times, strict=True)):
            await asyncio.sleep(max(0.0, loop_start + at / 1000 - asyncio.get_running_loop().time()))  # real time
            documents.apply(event)
            if isinstance(event, Edit):
                marks.append(EditMark(position, event.file, plugin.now_ms()))
                plugin.on_edit(position, event.file, documents.texts[event.file], documents.cursor[event.file])
            if progress:
                progress(position, plugin.in_flight)
        await plugin.drain()
        sampler.cancel()
        await asyncio.gather(sampler, return_exceptions=True)
        after = await read_metrics(session, upstream)
        duration = plugin.now_ms() / 1000
        acct = account(marks, plugin.results, pause_ms, next_typed(events))
        kept = app[RECORDS] if app is not None else None
        records = list(kept) if kept is not None else []
        admission = app[POLICIES].admission if app is not None else None
    predicted = _delta(before, after, "tokens_predicted_total")
    upstream_requests = sum(r.reached_upstream for r in records) if app is not None else len(plugin.results)
    timeouts = sum(r.outcome == "timeout" for r in records) + sum(r.error == "TimeoutError" for r in plugin.results)
    peaks = [r.vram_peak_mib for r in records if r.vram_peak_mib is not None]
    served_by: dict[str, int] = {}
    for record in records:
        if record.upstream is not None:
            served_by[record.upstream] = served_by.get(record.upstream, 0) + 1
    counted = [r for r in records if r.prompt_tokens is not None and r.cached_tokens is not None]
    reached = [r for r in records if r.reached_upstream]
    return PolicyResult(
        policy=policy.name, edits=acct.edits, client_requests=acct.requests, upstream_requests=upstream_requests,
        shown=acct.shown, pauses=acct.pauses, pause_coverage=acct.pause_coverage,
        latency_p50_ms=acct.latency(50), latency_p95_ms=acct.latency(95),
        upstream_prompt_tokens=_delta(before, after, "prompt_tokens_total"), upstream_completion_tokens=predicted,
        shown_completion_tokens=acct.shown_completion_tokens,
        wasted_completion_tokens=None if predicted is None else max(0.0, predicted - acct.shown_completion_tokens),
        timeouts=timeouts, errors=sum(1 for r in plugin.results if r.error and r.error != "TimeoutError"),
        max_queue_depth=int(max([admission.max_depth_seen if admission else 0, *(s[2] for s in samples)])),
        max_inflight=int(max([0, *(s[1] + s[2] for s in samples)])),
        vram_peak_mib=max(peaks) if peaks else None, duration_s=duration, inflight_series=samples,
        latencies_ms=acct.latencies_ms, idle_wait_s=idle_wait_s, predicted_chars=acct.predicted_chars,
        served_by=served_by, upstream_errors=sum(r.outcome == "upstream_error" for r in records),
        record_prompt_tokens=sum(r.prompt_tokens or 0 for r in counted),
        record_cached_tokens=sum(r.cached_tokens or 0 for r in counted),
        upstream_series=[(r.received_at, r.upstream, str(r.outcome), r.total_ms or 0.0) for r in reached],
    )  # fmt: skip


async def wait_idle(session: aiohttp.ClientSession, upstream: str, timeout_s: float = 120.0) -> float | None:
    """Wait until the server reports nothing running or queued; the seconds that took (None: it cannot say)."""
    loop = asyncio.get_running_loop()
    start = loop.time()
    while loop.time() - start < timeout_s:
        metrics = await read_metrics(session, upstream)
        if "requests_processing" not in metrics:
            return None
        if metrics["requests_processing"] + metrics.get("requests_deferred", 0) == 0:
            return loop.time() - start
        await asyncio.sleep(0.05)  # polling the server's own gauges: it has no event to wait on
    return loop.time() - start


def _delta(before: dict[str, float], after: dict[str, float], key: str) -> float | None:
    return after[key] - before[key] if key in before and key in after else None


async def _warm_up(plugin: Plugin, events: list[Event]) -> None:
    """Three requests before the clock starts, so model load and first-use costs are not measured."""
    documents = Documents()
    for event in events:
        documents.apply(event)
        if isinstance(event, Edit):
            break
    for name, text in list(documents.texts.items())[:1]:
        for _ in range(3):
            plugin.on_edit(-1, name, text, documents.cursor[name])
            await plugin.drain()


async def _sample(
    session: aiohttp.ClientSession, upstream: str, plugin: Plugin, out: list[tuple[float, float, float]]
) -> None:
    """Requests the upstream holds, running and queued (its own gauges), every 100 ms."""
    while True:
        metrics = await read_metrics(session, upstream)
        if metrics:
            out.append(
                (plugin.now_ms() / 1000, metrics.get("requests_processing", 0), metrics.get("requests_deferred", 0))
            )
        await asyncio.sleep(0.1)  # the sampling period
