"""The proxy's HTTP handlers: completions and discovery generated from the dialect registry, the
pass-through routes, and `/health`, `/metrics`, `/status`."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import asdict
from typing import Any

import orjson
from aiohttp import web

from mellum_proxy import __version__
from mellum_proxy.dialects import REGISTRY, Dialect
from mellum_proxy.dialects.base import CompletionRoute, DiscoveryRoute, openai_error
from mellum_proxy.dialects.openai import DONE, sse
from mellum_proxy.errors import InvalidRequestError, ProxyError, RequestTimeoutError
from mellum_proxy.http.answer import HttpAnswer
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
    STARTED,
    TELEMETRY,
    UPSTREAMS,
)
from mellum_proxy.http.middleware import request_id
from mellum_proxy.telemetry import GpuSampler
from mellum_proxy.telemetry.prometheus import CONTENT_TYPE as PROMETHEUS_CONTENT_TYPE
from mellum_proxy.upstream.passthrough import relay

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
GET_SILENCE_S = 5.0  # the most a forwarded GET (`/v1/models`) waits for the upstream's answer
BODY_READ_S = 10.0  # for a request's body to arrive (a client that trickles it holds a connection)


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


async def read_json(request: web.Request) -> object:
    if request.content.is_eof():  # the whole body came with the headers (a keystroke's does): no wait, no timer
        body = await request.read()
    else:
        try:
            async with asyncio.timeout(BODY_READ_S):
                body = await request.read()
        except TimeoutError as exc:
            raise RequestTimeoutError(f"the request body did not arrive within {BODY_READ_S:.0f} s") from exc
    try:
        return orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise InvalidRequestError(f"request body is not valid JSON: {exc}") from exc


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


async def passthrough(request: web.Request) -> web.StreamResponse:
    """Forward unchanged. An event stream is piped back as it arrives, and a failure after it started
    ends it with an error event and `[DONE]`; any other answer is read whole first, so that a failure
    is still an error response."""
    body = None
    if request.method == "POST":
        await read_json(request)  # bad JSON is our 400, not the upstream's
        body = await request.read()  # cached by aiohttp
    content_type = request.headers.get("Content-Type", "application/json")
    if not content_type.isascii():
        content_type = "application/json"
    silence_s = request.app[SECTIONS].upstream.passthrough_silence_s
    if request.method == "GET":  # a model list is one small read: a server silent this long is stalled
        silence_s = min(silence_s or GET_SILENCE_S, GET_SILENCE_S)
    upstream = request.app[UPSTREAMS].client  # the one serving now
    async with relay(upstream, request.method, request.path, body, content_type, silence_s) as answer:
        if answer.content_type != "text/event-stream":
            whole = b"".join([data async for data in answer.body])
            out = web.Response(status=answer.status, body=whole, content_type=answer.content_type)
            if answer.charset:
                out.charset = answer.charset
            return out
        stream = web.StreamResponse(status=answer.status)
        stream.content_type = answer.content_type
        request[STARTED] = True
        await stream.prepare(request)
        try:
            async for data in answer.body:
                await stream.write(data)
        except ProxyError as error:
            await stream.write(b"\n\n" + sse(openai_error(error)) + DONE)  # the blank line ends a cut event
        await stream.write_eof()
        return stream


def _dumps(value: Any) -> str:
    return orjson.dumps(value).decode()


async def health(request: web.Request) -> web.Response:
    """Ok once the upstream that serves answers and, when it is the primary, everything a completion depends
    on is decided (its template, the embedded server warm): `starting` until then."""
    upstream = request.app[UPSTREAMS].client  # the one serving
    reachable = await upstream.reachable()
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
        "tasks": len(asyncio.all_tasks()),  # for leak checks (`bench soak`)
        "connections": connections_status(app),
        "queued": policies.admission.depth,
        "debouncing": policies.debouncer.held(),
        "sessions": policies.supersede.sessions(),
        "recent": [
            {"id": r.id, "session": r.session, "outcome": r.outcome, "ttft_ms": r.ttft_ms, "total_ms": r.total_ms}
            for r in recent
        ],
        "vram": vram_status(gpu),
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


def connections_status(app: web.Application) -> dict[str, int] | None:
    guard = app.get(CONNECTIONS)
    if guard is None or guard.factory is None:
        return None  # not listening through `serve` (a test client)
    return {"open": guard.open, "limit": guard.limit, "refused": guard.refused, "too_slow": guard.too_slow}


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
