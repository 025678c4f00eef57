"""The app's shared resources as aiohttp cleanup contexts, and the components built from settings.

Order (set in `build_app`): the embedded server (if any), then telemetry, then the upstream client
with the policies, budget and service. Cleanup runs in reverse, so the request log flushes last.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path

from aiohttp import web

from mellum_proxy.assembly import Core, open_core
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
from mellum_proxy.policies import AdmissionQueue
from mellum_proxy.sections import TelemetrySection
from mellum_proxy.telemetry import GpuSampler, JsonlLog, NvmlBackend, ProxyMetrics, Telemetry
from mellum_proxy.telemetry.deadline_watch import DeadlineWatch
from mellum_proxy.upstream.embedded import EmbeddedServer, packaged_model

log = logging.getLogger("mellum_proxy")


async def embedded_upstream(app: web.Application) -> AsyncIterator[None]:
    section = app[SECTIONS].embedded
    server = EmbeddedServer(
        section.model,
        section.ctx_tokens,
        section.slots,
        section.threads,
        swa_full=True,  # gemma-3's sliding-window layers would otherwise re-process every prompt from its start
        kv_type=section.kv_type,
        sleep_idle_s=section.sleep_idle_s,
        spec=section.spec,
        cache_reuse=section.cache_reuse,
    )
    loading = asyncio.ensure_future(asyncio.to_thread(server.start))  # the model load blocks for a second or two
    try:
        url = await asyncio.shield(loading)
    except asyncio.CancelledError:  # stopped while it loads: a load cannot be cut short, so wait for it, then stop
        await asyncio.gather(loading, return_exceptions=True)
        await asyncio.to_thread(server.stop)
        raise
    log.debug("embedded llama.cpp server at %s (model %s)", url, section.model or "gemma-3-270m")
    app[EMBEDDED] = server
    yield
    await asyncio.to_thread(server.stop)


async def grace(app: web.Application) -> None:
    """aiohttp's shutdown step (after the listening stops, before the handlers are drained and the cleanup
    contexts run), for `serve` and `serve_app` alike: the requests in flight get the grace period, then each is
    answered with what it has and its dialect's final event."""
    if SERVICE in app:
        await app[SERVICE].close(app[SECTIONS].listen.shutdown_grace_s)


def gpu_opener(section: TelemetrySection, pid: int | None) -> Callable[[], NvmlBackend]:
    return lambda: NvmlBackend(section.gpu, pid)


def _open_log(path: Path | None, max_bytes: int, keep: int) -> JsonlLog | None:
    if path is None:
        return None
    sink = JsonlLog(path, max_bytes, keep)
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
    log_file = _open_log(section.log, section.log_max_bytes, section.log_keep)
    recorder = _open_log(section.record, section.log_max_bytes, section.log_keep)
    timeout_s = sections.policies.timeout_s
    watch = DeadlineWatch(round(timeout_s * 1000)) if timeout_s else None
    app[TELEMETRY] = Telemetry(app[RECORDS], gpu, log_file, log_content=section.log_content, recorder=recorder,
                               deadline_watch=watch)  # fmt: skip
    app[TELEMETRY].metrics = metrics(app)  # built once, before the core: its gauges read the core when scraped
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
    """The completion core on its upstreams (`mellum_proxy.assembly.open_core`), filed where the routes read it."""
    telemetry = app[TELEMETRY]
    embedded = app.get(EMBEDDED)

    def file(core: Core) -> None:
        assert core.pool is not None
        app[UPSTREAM], app[UPSTREAMS] = core.pool.primary, core.pool
        app[POLICIES], app[PROBES], app[SERVICE] = core.policies, core.discovery, core.service

    url = embedded.url if embedded is not None else None
    model = (embedded.model or packaged_model()) if embedded is not None else None
    async with open_core(app[SECTIONS], telemetry, url, model, file, lambda: log.info("%s", ready_block(app))):
        yield


def metrics(app: web.Application) -> ProxyMetrics:
    """The Prometheus metrics; the gauges read the admission queue and the upstreams the core files in `app` once
    it is built (zero and none before)."""
    telemetry = app[TELEMETRY]
    gpu = telemetry.gpu
    assert gpu is not None

    def admission() -> AdmissionQueue | None:
        return app[POLICIES].admission if POLICIES in app else None

    return ProxyMetrics(
        inflight=lambda: queue.running if (queue := admission()) else 0,
        queued=lambda: queue.depth if (queue := admission()) else 0,
        gpu_used=lambda: gpu.latest.used_bytes if gpu.latest and gpu.source == "nvml" else None,
        gpu_total=lambda: gpu.latest.total_bytes if gpu.latest and gpu.source == "nvml" else None,
        log_errors=lambda: sum(sink.errors for sink in telemetry.sinks()),
        log_dropped=lambda: sum(sink.dropped for sink in telemetry.sinks()),
        upstreams=lambda: app[UPSTREAMS].status() if UPSTREAMS in app else [],
        lanes=lambda: lanes(queue) if (queue := admission()) else {},
    )


def lanes(admission: AdmissionQueue) -> dict[str, tuple[int, int]]:
    """Each lane's (requests upstream, requests waiting) now."""
    return {"completion": (admission.running, admission.depth), "bulk": (admission.bulk_running, admission.bulk_depth)}


def ready_block(app: web.Application) -> str:
    """What the proxy has found and chosen, said once, when it is all true: the upstream, how prompts are
    built, what each request may do, and the GPU."""
    sections, discovery, gpu = app[SECTIONS], app[PROBES], app[TELEMETRY].gpu
    view = discovery.view
    upstream = f"upstream {view.url}"
    if EMBEDDED in app and discovery.upstream.base_url == app[EMBEDDED].url:
        embedded = app[EMBEDDED]
        upstream += f" (embedded llama.cpp, {embedded.threads} thread{'s' if embedded.threads > 1 else ''}"
        upstream += f", speculation {embedded.spec}, cache reuse {embedded.cache_reuse})"
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
