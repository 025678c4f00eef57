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

from mellum_proxy.assembly import build_core, build_counter, upstream_clients
from mellum_proxy.completion import Policies
from mellum_proxy.discovery import Discovery
from mellum_proxy.errors import UpstreamError
from mellum_proxy.http.keys import (
    BOOTED,
    EMBEDDED,
    GPU_OPENER,
    POLICIES,
    PROBES,
    RECORDS,
    SECTIONS,
    SERVICE,
    TELEMETRY,
    UPSTREAM,
    UPSTREAMS,
)
from mellum_proxy.sections import TelemetrySection, UpstreamSection
from mellum_proxy.telemetry import GpuSampler, JsonlLog, NvmlBackend, ProxyMetrics, Telemetry
from mellum_proxy.telemetry.deadline_watch import DeadlineWatch
from mellum_proxy.upstream import UpstreamClient
from mellum_proxy.upstream.embedded import EmbeddedServer, packaged_model
from mellum_proxy.upstream.failover import Upstreams, failover_answer_s
from mellum_proxy.upstream.kinds import discover

log = logging.getLogger("mellum_proxy")


async def embedded_upstream(app: web.Application) -> AsyncIterator[None]:
    section = app[SECTIONS].embedded
    server = EmbeddedServer(
        section.model,
        section.ctx_tokens,
        section.slots,
        section.threads,
        swa_full=True,  # gemma-3's sliding-window layers would otherwise re-process every prompt from its start
    )
    url = await asyncio.to_thread(server.start)  # the model load blocks for a second or two
    log.debug("embedded llama.cpp server at %s (model %s)", url, section.model or "gemma-3-270m")
    app[EMBEDDED] = server
    yield
    await asyncio.to_thread(server.stop)


def gpu_opener(section: TelemetrySection, pid: int | None) -> Callable[[], NvmlBackend]:
    return lambda: NvmlBackend(section.gpu, pid)


def _open_log(path: Path | None, max_bytes: int) -> JsonlLog | None:
    if path is None:
        return None
    sink = JsonlLog(path, max_bytes)
    sink.start()
    return sink


async def telemetry(app: web.Application) -> AsyncIterator[None]:
    """The GPU sampler and the request log: started before requests, flushed after the last one."""
    sections = app[SECTIONS]
    section = sections.telemetry
    pid = os.getpid() if EMBEDDED in app else section.upstream_pid
    gpu = GpuSampler(app.get(GPU_OPENER) or gpu_opener(section, pid), section.vram_interval_s)
    await asyncio.to_thread(gpu.open)
    sampler = asyncio.create_task(gpu.run(), name="gpu-sampler")
    log_file = _open_log(section.log, section.log_max_bytes)
    recorder = _open_log(section.record, section.log_max_bytes)
    timeout_s = sections.policies.timeout_s
    watch = DeadlineWatch(round(timeout_s * 1000)) if timeout_s else None
    app[TELEMETRY] = Telemetry(app[RECORDS], gpu, log_file, log_content=section.log_content, recorder=recorder,
                               deadline_watch=watch)  # fmt: skip
    try:
        yield
    finally:
        app[TELEMETRY].settle()  # the last suggestions, judged by what was seen, before the log closes
        sampler.cancel()
        await asyncio.gather(sampler, return_exceptions=True)
        gpu.close()
        for sink in (log_file, recorder):
            if sink is not None:
                await sink.close()


async def upstream_client(app: web.Application) -> AsyncIterator[None]:
    """The upstream session, and the completion core built on it (`mellum_proxy.assembly`)."""
    sections = app[SECTIONS]
    section = sections.upstream
    urls = upstream_urls(section, app[EMBEDDED].url if EMBEDDED in app else None)
    timeout = aiohttp.ClientTimeout(total=None, sock_connect=section.connect_timeout_s)
    connector = aiohttp.TCPConnector(limit=0)  # concurrency is the policies' job, not the pool's
    headers = dict(section.headers)  # on every upstream request, pass-through too
    if section.api_key:
        headers["Authorization"] = f"Bearer {section.api_key}"
    async with aiohttp.ClientSession(timeout=timeout, connector=connector, headers=headers or None) as session:
        clients = upstream_clients(session, urls, section)
        upstream = clients[0]  # the primary: what discovery asks; the others are its fallbacks
        upstream.native_ollama = section.kind == "ollama"
        app[UPSTREAM] = upstream
        answer_s = failover_answer_s(sections.policies.timeout_s, section.answer_timeout_s)
        pool = app[UPSTREAMS] = Upstreams(clients, answer_s, section.health_interval_s)
        telemetry = app[TELEMETRY]
        reachable = await asyncio.gather(*(client.reachable() for client in clients))
        for member, up in zip(pool.members, reachable, strict=True):
            member.up = up or len(clients) == 1
            member.last_error = None if member.up else "not reachable at start"
        found = await discover(upstream, section.kind) if reachable[0] else None
        slots = found.slots if found is not None and sections.policies.max_concurrency == 0 else None
        counter = await build_counter(sections.budget, pool, upstream.model)
        embedded_first = EMBEDDED in app and urls[0] == app[EMBEDDED].url
        model = (app[EMBEDDED].model or packaged_model()) if embedded_first else None
        core = build_core(sections, pool, upstream, counter, telemetry, slots, model, tokenize=pool)
        policies, discovery = app[POLICIES], app[PROBES] = core.policies, core.discovery
        app[SERVICE] = core.service
        telemetry.metrics = metrics(telemetry, policies, pool)
        if found is not None:
            discovery.apply(found)
        if core.budget.settings.template is None:
            log.warning("fim_template=none sends the text after the cursor as `suffix`: vLLM and llama.cpp "
                        "builds that list it as unsupported answer 400; prefer the model's template")  # fmt: skip
        discovery.on_ready = lambda: log.info("%s", ready_block(app))
        if reachable[0]:
            await discovery.prepare()  # decided (and the embedded server warm) before the first request can come
        tasks = [asyncio.create_task(discovery.run(), name="upstream-discovery")]
        if len(clients) > 1:
            pool.on_up = fallback_discovery(section.model)
            for client, up in zip(clients[1:], reachable[1:], strict=True):
                if up:
                    await pool.on_up(client)
            log.info("upstreams in order: %s; health checked every %.0f ms",
                     ", ".join(c.shown_url for c in clients), section.health_interval_s * 1000)  # fmt: skip
            if pool.client is not upstream:
                await discovery.follow(pool.client)  # the primary is down: the fallback serves, as it is
            tasks.append(asyncio.create_task(pool.watch(section.health_interval_s), name="upstream-health"))
            tasks.append(asyncio.create_task(follow_serving(pool, discovery), name="upstream-follow"))
        try:
            yield
        finally:
            await core.service.close(0)  # its tasks use the session: they end before it closes
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)


def metrics(telemetry: Telemetry, policies: Policies, pool: Upstreams) -> ProxyMetrics:
    gpu = telemetry.gpu
    assert gpu is not None
    return ProxyMetrics(
        inflight=lambda: policies.admission.running,
        queued=lambda: policies.admission.depth,
        gpu_used=lambda: gpu.latest.used_bytes if gpu.latest and gpu.source == "nvml" else None,
        gpu_total=lambda: gpu.latest.total_bytes if gpu.latest and gpu.source == "nvml" else None,
        log_errors=lambda: sum(sink.errors for sink in telemetry.sinks()),
        log_dropped=lambda: sum(sink.dropped for sink in telemetry.sinks()),
        upstreams=pool.status,
    )


def ready_block(app: web.Application) -> str:
    """What the proxy has found and chosen, said once, when it is all true: the upstream, how prompts are
    built, what each request may do, and the GPU."""
    sections, discovery, gpu = app[SECTIONS], app[PROBES], app[TELEMETRY].gpu
    view = discovery.view
    upstream = f"upstream {view.url}"
    if EMBEDDED in app and discovery.upstream.base_url == app[EMBEDDED].url:
        threads = app[EMBEDDED].threads
        upstream += f" (embedded llama.cpp, {threads} thread{'s' if threads > 1 else ''})"
    found = discovery.found.describe() if discovery.found else "not reachable yet"
    context = f"{view.context_tokens} tokens a request"
    if view.context_tokens < view.configured_context_tokens:
        context += f" (max_context_tokens {view.configured_context_tokens} lowered to the upstream's)"
    why = view.template_why if view.template != "custom" else "set"
    tokenizer = view.tokenizer + (" (exact)" if view.exact else " (estimate)")
    policies = sections.policies
    deadline = f"timeout_ms {policies.timeout_s * 1000:.0f}" if policies.timeout_s else "no deadline"
    gpu_line = "GPU memory recorded through NVML" if gpu and gpu.source == "nvml" else (
        f"GPU memory not recorded ({gpu.reason if gpu else 'no sampler'})")  # fmt: skip
    elapsed = time.monotonic() - app[BOOTED]
    return "\n".join([
        f"ready in {elapsed:.1f} s: {upstream}: {found}",
        f"  prompts: FIM template {view.template} ({why}), tokenizer {tokenizer}, {context}, "
        f"max_tokens {sections.budget.max_tokens}",
        f"  requests: {view.slots} upstream at once, {policies.max_inflight} a session, {deadline}, "
        f"dispatch {policies.dispatch}",
        f"  {gpu_line}",
    ])  # fmt: skip


def upstream_urls(section: UpstreamSection, embedded_url: str | None) -> list[str]:
    """The upstreams in order: the embedded server alone, or after the `upstream`s the user set."""
    if embedded_url is None:
        return list(section.urls)
    if not section.urls_set:
        return [embedded_url]
    return [*section.urls, embedded_url]


def fallback_discovery(model: str | None) -> Callable[[UpstreamClient], Awaitable[None]]:
    """What a fallback upstream says when it is (again) up: the model it serves (its context, slots and
    tokenizer are taken when it serves: `Discovery.follow`)."""

    async def discover_fallback(client: UpstreamClient) -> None:
        found = await discover(client)
        if model is None and found.model is not None:
            client.model = found.model
        log.info("fallback upstream %s: %s", client.shown_url, found.describe())

    return discover_fallback


async def follow_serving(pool: Upstreams, discovery: Discovery) -> None:
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
            await discovery.follow(current)
        except UpstreamError as exc:  # it went down again meanwhile: the next change says who serves
            log.info("upstream %s: %s", current.shown_url, exc.type)
