"""The app's shared resources as aiohttp cleanup contexts, and the components built from settings.

Order (set in `build_app`): the embedded server (if any), then telemetry, then the upstream client
with the policies, budget and service. Cleanup runs in reverse, so the request log flushes last.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import aiohttp
from aiohttp import web

from proxy.budget import BudgetSettings, CharsEstimator, ContextBudget, TokenCounter, UpstreamTokenizer, template_for
from proxy.budget.gguf_vocab import UnsupportedVocabulary
from proxy.budget.local import load_local
from proxy.budget.tokenizers import Tokenize, upstream_counter
from proxy.clock import LOOP_CLOCK, Clock
from proxy.completion import CompletionService, Policies
from proxy.config import Settings
from proxy.errors import UpstreamError
from proxy.http.keys import (
    BOOTED,
    EMBEDDED,
    GPU_OPENER,
    POLICIES,
    PROBES,
    RECORDS,
    SERVICE,
    SETTINGS,
    TELEMETRY,
    UPSTREAM,
    UPSTREAMS,
)
from proxy.http.probes import UpstreamProbes
from proxy.policies import AdmissionQueue, Debouncer, Dispatch, Supersede
from proxy.policies.reuse import ReuseCache
from proxy.telemetry import GpuSampler, JsonlLog, NvmlBackend, ProxyMetrics, Telemetry
from proxy.telemetry.deadline_watch import DeadlineWatch
from proxy.upstream import UpstreamClient
from proxy.upstream.embedded import EmbeddedServer, packaged_model
from proxy.upstream.failover import Upstreams
from proxy.upstream.kinds import discover

log = logging.getLogger("mellum_proxy")


async def embedded_upstream(app: web.Application) -> AsyncIterator[None]:
    settings = app[SETTINGS]
    server = EmbeddedServer(
        settings.model,
        settings.embedded_ctx_tokens,
        settings.embedded_slots,
        settings.embedded_threads,
        swa_full=True,  # gemma-3's sliding-window layers would otherwise re-process every prompt from its start
    )
    url = await asyncio.to_thread(server.start)  # the model load blocks for a second or two
    log.debug("embedded llama.cpp server at %s (model %s)", url, settings.model or "gemma-3-270m")
    app[EMBEDDED] = server
    yield
    await asyncio.to_thread(server.stop)


def gpu_opener(settings: Settings, pid: int | None) -> Callable[[], NvmlBackend]:
    return lambda: NvmlBackend(settings.gpu, pid)


def _open_log(path: Path | None, max_mb: float) -> JsonlLog | None:
    if path is None:
        return None
    sink = JsonlLog(path, int(max_mb * 1024 * 1024))
    sink.start()
    return sink


async def telemetry(app: web.Application) -> AsyncIterator[None]:
    """The GPU sampler and the request log: started before requests, flushed after the last one."""
    settings = app[SETTINGS]
    pid = os.getpid() if EMBEDDED in app else (settings.upstream_pid or None)
    gpu = GpuSampler(app.get(GPU_OPENER) or gpu_opener(settings, pid), settings.vram_interval_ms / 1000)
    await asyncio.to_thread(gpu.open)
    sampler = asyncio.create_task(gpu.run(), name="gpu-sampler")
    log_file = _open_log(settings.log, settings.log_max_mb)
    recorder = _open_log(settings.record, settings.log_max_mb)
    watch = DeadlineWatch(settings.timeout_ms) if settings.timeout_ms else None
    app[TELEMETRY] = Telemetry(app[RECORDS], gpu, log_file, log_content=settings.log_content, recorder=recorder,
                               deadline_watch=watch)  # fmt: skip
    try:
        yield
    finally:
        sampler.cancel()
        await asyncio.gather(sampler, return_exceptions=True)
        gpu.close()
        for sink in (log_file, recorder):
            if sink is not None:
                await sink.close()


async def upstream_client(app: web.Application) -> AsyncIterator[None]:
    """The upstream session, and what is built on it: policies, context budget, the service."""
    settings = app[SETTINGS]
    urls = upstream_urls(settings, app[EMBEDDED].url if EMBEDDED in app else None)
    timeout = aiohttp.ClientTimeout(total=None, sock_connect=settings.upstream_connect_timeout_ms / 1000)
    connector = aiohttp.TCPConnector(limit=0)  # concurrency is the policies' job, not the pool's
    key = settings.upstream_api_key
    headers = dict(settings.headers)  # on every upstream request, pass-through too
    if key:
        headers["Authorization"] = f"Bearer {key}"
    async with aiohttp.ClientSession(timeout=timeout, connector=connector, headers=headers or None) as session:
        clients = [upstream_client_for(session, url, settings) for url in urls]
        upstream = clients[0]  # the primary: what the probes ask; the others are its fallbacks
        upstream.native_ollama = settings.upstream_kind == "ollama"
        app[UPSTREAM] = upstream
        pool = app[UPSTREAMS] = Upstreams(clients)
        telemetry = app[TELEMETRY]
        reachable = await asyncio.gather(*(client.reachable() for client in clients))
        for member, up in zip(pool.members, reachable, strict=True):
            member.up = up or len(clients) == 1
            member.last_error = None if member.up else "not reachable at start"
        found = await discover(upstream, settings.upstream_kind) if reachable[0] else None
        slots = found.slots if found is not None and settings.max_concurrency == 0 else None
        known = settings.max_concurrency != 0 or slots is not None
        policies = app[POLICIES] = build_policies(settings, slots, telemetry.clock)
        gpu = telemetry.gpu
        assert gpu is not None
        telemetry.metrics = ProxyMetrics(
            inflight=lambda: policies.admission.running,
            queued=lambda: policies.admission.depth,
            gpu_used=lambda: gpu.latest.used_bytes if gpu.latest and gpu.source == "nvml" else None,
            gpu_total=lambda: gpu.latest.total_bytes if gpu.latest and gpu.source == "nvml" else None,
            log_errors=lambda: sum(sink.errors for sink in telemetry.sinks()),
            log_dropped=lambda: sum(sink.dropped for sink in telemetry.sinks()),
            upstreams=pool.status,
        )
        budget = ContextBudget(budget_settings(settings), await build_counter(settings, pool, upstream.model))
        embedded_first = EMBEDDED in app and urls[0] == app[EMBEDDED].url
        model = (app[EMBEDDED].model or packaged_model()) if embedded_first else None
        probes = app[PROBES] = UpstreamProbes(settings, upstream, policies, budget, model, known, tokenize=pool)
        if found is not None:
            probes.apply(found)
        if budget.settings.template is None:
            log.warning("fim_template=none sends the text after the cursor as `suffix`: vLLM and llama.cpp "
                        "builds that list it as unsupported answer 400; prefer the model's template")  # fmt: skip
        app[SERVICE] = CompletionService(pool, policies, budget, telemetry)
        probes.on_ready = lambda: log.info("%s", ready_block(app))
        if reachable[0]:
            await probes.prepare()  # decided (and the embedded server warm) before the first request can come
        tasks = [asyncio.create_task(probes.run(), name="upstream-probes")]
        if len(clients) > 1:
            pool.on_up = fallback_discovery(settings)
            for client, up in zip(clients[1:], reachable[1:], strict=True):
                if up:
                    await pool.on_up(client)
            log.info("upstreams in order: %s; health checked every %d ms",
                     ", ".join(c.shown_url for c in clients), settings.health_interval_ms)  # fmt: skip
            if pool.client is not upstream:
                await probes.follow(pool.client)  # the primary is down: the fallback serves, as it is
            tasks.append(asyncio.create_task(pool.watch(settings.health_interval_ms / 1000), name="upstream-health"))
            tasks.append(asyncio.create_task(follow_serving(pool, probes), name="upstream-follow"))
        try:
            yield
        finally:
            await app[SERVICE].close(0)  # its tasks use the session: they end before it closes
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)


def ready_block(app: web.Application) -> str:
    """What the proxy has found and chosen, said once, when it is all true: the upstream, how prompts are
    built, what each request may do, and the GPU."""
    settings, probes, policies, gpu = app[SETTINGS], app[PROBES], app[POLICIES], app[TELEMETRY].gpu
    budget = probes.budget
    template = budget.settings.template
    upstream = f"upstream {probes.upstream.shown_url}"
    if EMBEDDED in app and probes.upstream.base_url == app[EMBEDDED].url:
        threads = app[EMBEDDED].threads
        upstream += f" (embedded llama.cpp, {threads} thread{'s' if threads > 1 else ''})"
    found = probes.found.describe() if probes.found else "not reachable yet"
    context = f"{budget.settings.max_context_tokens} tokens a request"
    if budget.settings.max_context_tokens < budget.configured_context:
        context += f" (max_context_tokens {budget.configured_context} lowered to the upstream's)"
    why = probes.template_why if template is not None and template.name != "custom" else "set"
    tokenizer = budget.counter.method + (" (exact)" if budget.counter.exact_count else " (estimate)")
    deadline = f"timeout_ms {settings.timeout_ms}" if settings.timeout_ms else "no deadline"
    gpu_line = "GPU memory recorded through NVML" if gpu and gpu.source == "nvml" else (
        f"GPU memory not recorded ({gpu.reason if gpu else 'no sampler'})")  # fmt: skip
    elapsed = time.monotonic() - app[BOOTED]
    return "\n".join([
        f"ready in {elapsed:.1f} s: {upstream}: {found}",
        f"  prompts: FIM template {template.name if template else 'none'} ({why}), tokenizer {tokenizer}, {context}, "
        f"max_tokens {budget.settings.max_tokens}",
        f"  requests: {policies.admission.limit} upstream at once, {settings.max_inflight} a session, {deadline}, "
        f"dispatch {settings.dispatch_rule}",
        f"  {gpu_line}",
    ])  # fmt: skip


def upstream_urls(settings: Settings, embedded_url: str | None) -> list[str]:
    """The upstreams in order: the embedded server alone, or after the `upstream`s the user set."""
    if embedded_url is None:
        return list(settings.upstream)
    if "upstream" not in settings.model_fields_set:
        return [embedded_url]
    return [*settings.upstream, embedded_url]


def upstream_client_for(session: aiohttp.ClientSession, url: str, settings: Settings) -> UpstreamClient:
    client = UpstreamClient(session, url)
    client.model = settings.upstream_model
    client.answer_timeout_s = settings.upstream_answer_timeout_ms / 1000 or None
    if settings.default_temperature is not None:
        client.defaults["temperature"] = settings.default_temperature
    if settings.routing_key != "none":
        client.routing_header = settings.routing_key_header
        client.developer_id = settings.developer_id
        client.route_sessions = settings.routing_key == "session"
    return client


def fallback_discovery(settings: Settings) -> Callable[[UpstreamClient], Awaitable[None]]:
    """What a fallback upstream says when it is (again) up: the model it serves (its context, slots and
    tokenizer are taken when it serves: `UpstreamProbes.follow`)."""

    async def discover_fallback(client: UpstreamClient) -> None:
        found = await discover(client)
        if settings.upstream_model is None and found.model is not None:
            client.model = found.model
        log.info("fallback upstream %s: %s", client.shown_url, found.describe())

    return discover_fallback


def build_policies(settings: Settings, slots: int | None = None, clock: Clock = LOOP_CLOCK) -> Policies:
    """The policies from the settings; `max_concurrency = 0` takes the upstream's `slots` (1 while unknown)."""
    limit = settings.max_concurrency
    if limit == 0:
        limit = slots or 1
        why = f"the upstream's {slots} slots" if slots else "1 until the upstream says how many slots it has"
        log.debug("max_concurrency: %s", why)
    fixed = settings.dispatch_rule == "fixed"
    dispatch = None if fixed else Dispatch(settings.hold_idle_max_ms / 1000, settings.hold_busy_max_ms / 1000,
                                           settings.hold_gap_factor, clock, settings.hold_min_ms / 1000)  # fmt: skip
    return Policies(
        debouncer=Debouncer(settings.debounce_ms / 1000 if fixed else 0.0, clock),
        supersede=Supersede(settings.max_inflight),
        admission=AdmissionQueue(limit, settings.max_queue),
        ttft_timeout_ms=settings.ttft_timeout_ms,
        timeout_ms=settings.timeout_ms,
        complete_in_comments=settings.complete_in_comments,
        clock=clock,
        dispatch=dispatch,
        reuse=ReuseCache() if settings.reuse else None,
        keep_prefill=settings.keep_prefill,
    )


def budget_settings(settings: Settings) -> BudgetSettings:
    return BudgetSettings(
        max_context_tokens=settings.max_context_tokens,
        max_tokens=settings.max_tokens,
        prefix_ratio=settings.prefix_ratio,
        step_lines=settings.context_step_lines,
        template=template_for(settings.fim_template),
        stops=("\n\n",) if settings.stop_at_blank_line else (),
    )


async def follow_serving(pool: Upstreams, probes: UpstreamProbes) -> None:
    """For the app's lifetime: whenever another upstream starts serving, the proxy follows it."""
    followed = [pool.client]
    while True:
        try:
            await pool.changes.wait_for(lambda: pool.client is not followed[-1], timeout_s=3600)
        except TimeoutError:
            continue
        current = pool.client
        followed[-1:] = [current]
        try:
            await probes.follow(current)
        except UpstreamError as exc:  # it went down again meanwhile: the next change says who serves
            log.info("upstream %s: %s", current.shown_url, exc.type)


async def build_counter(settings: Settings, upstream: Tokenize, model: str | None = None) -> TokenCounter:
    """The tokenizer to start with. `auto`: the upstream's /tokenize when it answers (with each token's text,
    else a count), else the calibrated character estimate; `UpstreamProbes` may find an exact local one later."""
    choice = settings.tokenizer
    if choice == "chars":
        return CharsEstimator()
    if choice == "upstream":
        return await upstream_counter(upstream, model) or UpstreamTokenizer(upstream)
    if choice != "auto":
        try:
            return await asyncio.to_thread(load_local, Path(choice))  # reading the file blocks
        except UnsupportedVocabulary as exc:
            raise ValueError(str(exc)) from exc
    return await upstream_counter(upstream, model) or CharsEstimator()
