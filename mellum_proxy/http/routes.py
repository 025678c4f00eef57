"""The proxy's HTTP handlers: completions and discovery generated from the dialect registry, the
pass-through routes, and `/health`, `/metrics`, `/status`."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import asdict
from typing import Any

import orjson
from aiohttp import web

from mellum_proxy import __version__
from mellum_proxy.dialects import REGISTRY, Dialect
from mellum_proxy.dialects.base import CompletionRoute, DiscoveryRoute
from mellum_proxy.http.answer import HttpAnswer
from mellum_proxy.http.bodies import read_json
from mellum_proxy.http.guard import check_host
from mellum_proxy.http.keys import (
    CONNECTIONS,
    POLICIES,
    PROBES,
    RECORDED,
    RECORDS,
    ROUTES,
    SECTIONS,
    SERVICE,
    SETTINGS,
    TELEMETRY,
    UPSTREAMS,
)
from mellum_proxy.http.middleware import request_id
from mellum_proxy.http.passthrough import passthrough
from mellum_proxy.policies import AdmissionQueue
from mellum_proxy.telemetry import GpuSampler, RequestRecord
from mellum_proxy.telemetry.prometheus import CONTENT_TYPE as PROMETHEUS_CONTENT_TYPE
from mellum_proxy.telemetry.stats import percentile
from mellum_proxy.upstream.health import reachable as upstream_reachable

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def add_routes(app: web.Application) -> None:
    """Every dialect's routes from the registry, then the proxy's own."""
    owners: dict[str, tuple[Dialect, CompletionRoute | None]] = {}
    for dialect in REGISTRY:
        for route in dialect.completions:
            app.router.add_post(route.path, completion_handler(dialect, route))
            owners[route.path] = (dialect, route)
        for discovery in dialect.discovery:
            app.router.add_route(discovery.method, discovery.path, discovery_handler(discovery))
            owners[discovery.path] = (dialect, None)
        for method, path in dialect.passthrough:
            app.router.add_route(method, path, passthrough)
            owners[path] = (dialect, None)
    app[ROUTES] = owners
    app.router.add_get("/health", health)
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/status", status)


def completion_handler(dialect: Dialect, route: CompletionRoute) -> Handler:
    """Parse in the dialect, serve through the one service, answer in the dialect's shape."""

    async def handle(request: web.Request) -> web.StreamResponse:
        service = request.app[SERVICE]
        arrived = service.clock.now()  # its record counts from here, the body's read included
        normalized = route.parse(await read_json(request), request.headers, request_id(request))
        answer = HttpAnswer(request, dialect.encoder(normalized))
        request[RECORDED] = True
        try:
            await service.complete(normalized, answer, arrived)
        except ConnectionResetError:  # the editor left while its answer was written: recorded as `client_gone`;
            return answer.response or web.Response()  # aiohttp ends a closed connection quietly (no traceback)
        return answer.result()

    return handle


class _Discovery:
    def __init__(self, app: web.Application) -> None:
        self.app = app
        # the one discovered value the budget fits prompts to (the setting, lowered to the server's context
        # per request): Continue sizes its prompts by the `num_ctx` that `/api/show` reports
        self.max_context_tokens = app[PROBES].view.context_tokens

    async def model_ids(self) -> list[str]:
        return await self.app[UPSTREAMS].model_ids()


def discovery_handler(route: DiscoveryRoute) -> Handler:
    async def handle(request: web.Request) -> web.StreamResponse:
        body = await read_json(request) if request.method == "POST" else None
        answer = await route.answer(_Discovery(request.app), body)
        return web.json_response(answer, dumps=_dumps)

    return handle


def _dumps(value: Any) -> str:
    return orjson.dumps(value).decode()


async def health(request: web.Request) -> web.Response:
    """Ok once the upstream that serves answers and, when it is the primary, everything a completion depends
    on is decided (its template, the embedded server warm): `starting` until then."""
    upstream = request.app[UPSTREAMS].client  # the one serving
    reachable = await upstream_reachable(upstream)
    probes = request.app[PROBES]
    starting = upstream is probes.upstream and not probes.ready.is_set()
    status = "unavailable" if not reachable else "starting" if starting else "ok"
    body = {"status": status, "upstream": {"url": upstream.shown_url, "reachable": reachable}}
    return web.json_response(body, status=200 if status == "ok" else 503, dumps=_dumps)


async def metrics(request: web.Request) -> web.Response:
    check_host(request, request.app[SECTIONS].listen)
    telemetry = request.app[TELEMETRY]
    assert telemetry.metrics is not None
    return web.Response(body=telemetry.metrics.render(), headers={"Content-Type": PROMETHEUS_CONTENT_TYPE})


async def status(request: web.Request) -> web.Response:
    """The live state: settings in force, upstream, per-session admissions, recent requests, VRAM."""
    check_host(request, request.app[SECTIONS].listen)
    return web.json_response(status_body(request.app), dumps=_dumps)


def status_body(app: web.Application) -> dict[str, Any]:
    """`/status`'s answer (the live page's state events carry it too)."""
    policies, gpu = app[POLICIES], app[TELEMETRY].gpu
    records = app[RECORDS]
    recent = list(records)[-20:]
    return {
        "version": __version__,
        "settings": app[SETTINGS].shown(),
        "upstream": {"url": app[UPSTREAMS].shown_url, "max_concurrency": policies.admission.limit},
        "discovered": asdict(app[PROBES].view),  # what the primary upstream said it is
        "upstreams": app[UPSTREAMS].status(),
        "inflight": policies.admission.running,
        "tasks": len(asyncio.all_tasks()),  # for leak checks (`benchmarks soak`)
        "connections": connections_status(app),
        "queued": policies.admission.depth,
        "lanes": lanes_status(policies.admission, recent_queue_ms(records), recent_queue_ms(app[TELEMETRY].bulk)),
        "debouncing": policies.debouncer.held(),
        "sessions": policies.supersede.sessions(),
        "documents": app[SERVICE].documents.held() if SERVICE in app else 0,  # anonymous editors' documents kept
        "recent": [
            {"id": r.id, "session": r.session, "outcome": r.outcome, "ttft_ms": r.ttft_ms, "total_ms": r.total_ms}
            for r in recent
        ],
        "vram": vram_status(gpu),
        "speculation": speculation_status(records),
        "logs": [
            {
                "path": str(sink.path),
                "written": sink.written,
                "dropped": sink.dropped,
                "errors": sink.errors,
                "error": sink.error,
                "rotate_error": sink.rotate_error,
            }
            for sink in app[TELEMETRY].sinks()
        ],
    }


def speculation_status(records: Iterable[RequestRecord]) -> dict[str, Any] | None:
    """What the server's speculation drafted for the kept requests and the model accepted (None: it drafted
    nothing, or does not speculate)."""
    drafted = accepted = 0
    for record in records:
        if record.draft_n:
            drafted += record.draft_n
            accepted += record.draft_n_accepted or 0
    return {"drafted": drafted, "accepted": accepted, "acceptance": accepted / drafted} if drafted else None


def recent_queue_ms(records: Iterable[RequestRecord]) -> list[float]:
    return [r.queue_ms for r in records if r.queue_ms is not None]


def lanes_status(admission: AdmissionQueue, completion_waits: list[float], bulk_waits: list[float]) -> dict[str, Any]:
    """Each lane: upstream now, waiting now, and how long the recent ones waited for a slot (ms)."""

    def waited(values: list[float]) -> dict[str, float | int | None]:
        return {"p50": percentile(values, 50), "p95": percentile(values, 95), "of": len(values)}

    return {
        "completion": {"inflight": admission.running, "queued": admission.depth, "reserve": admission.reserve,
                       "wait_ms": waited(completion_waits)},
        "bulk": {"inflight": admission.bulk_running, "queued": admission.bulk_depth, "limit": admission.bulk_limit,
                 "wait_ms": waited(bulk_waits)},
    }  # fmt: skip


def connections_status(app: web.Application) -> dict[str, int] | None:
    guard = app.get(CONNECTIONS)
    if guard is None or guard.factory is None:
        return None  # not listening through `serve` (a test client)
    return {"open": guard.open, "idle": guard.idle, "limit": guard.limit, "refused": guard.refused,
            "evicted": guard.evicted, "too_slow": guard.too_slow}  # fmt: skip


def vram_status(gpu: GpuSampler | None) -> dict[str, object]:
    latest = gpu.latest if gpu is not None and gpu.source == "nvml" else None
    return {
        "source": gpu.source if gpu else "none",
        "reason": gpu.reason if gpu else "no sampler",
        "used_mib": latest.used_mib if latest else None,
        "total_mib": latest.total_bytes / 1024**2 if latest else None,
        "process_mib": latest.process_bytes / 1024**2 if latest and latest.process_bytes is not None else None,
        "peak_mib": gpu.peak_mib if latest and gpu else None,
    }
