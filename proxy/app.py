"""`build_app(settings)`: routes, the error middleware, and the lifecycle of shared resources.

Client disconnects cancel the handler (the server runs with `handler_cancellation=True`): the
proxy exists to drop stale work, so a request whose editor has gone must stop the upstream too.
"""

from __future__ import annotations

import asyncio
import logging
import os
import secrets
from collections.abc import AsyncIterator, Callable, Mapping
from pathlib import Path
from typing import Any

import aiohttp
import orjson
from aiohttp import web

from proxy import __version__
from proxy.budget import (
    BudgetSettings,
    CharsEstimator,
    ContextBudget,
    HfTokenizer,
    TokenCounter,
    UpstreamTokenizer,
    template_for,
)
from proxy.completion import CompletionService, Policies
from proxy.config import Settings
from proxy.dialects import llamacpp, ollama, openai
from proxy.dialects.base import StreamWriter, error_body
from proxy.embedded import EmbeddedServer
from proxy.errors import (
    InvalidRequestError,
    MethodNotAllowedError,
    NotFoundError,
    ProxyError,
    RequestTooLargeError,
    UpstreamError,
)
from proxy.models import NormalizedRequest
from proxy.passthrough import forward
from proxy.policies import AdmissionQueue, Debouncer, Supersede
from proxy.telemetry import GpuSampler, JsonlLog, NvmlBackend, ProxyMetrics, RecentRecords, Telemetry
from proxy.telemetry.prometheus import CONTENT_TYPE as PROMETHEUS_CONTENT_TYPE
from proxy.upstream import UpstreamClient

log = logging.getLogger("mellum_proxy")

SETTINGS = web.AppKey("settings", Settings)
UPSTREAM = web.AppKey("upstream", UpstreamClient)
SERVICE = web.AppKey("service", CompletionService)
POLICIES = web.AppKey("policies", Policies)
RECORDS = web.AppKey("records", RecentRecords)
TELEMETRY = web.AppKey("telemetry", Telemetry)
EMBEDDED = web.AppKey("embedded", EmbeddedServer)
# Tests inject a fake GPU backend here; production opens NVML.
GPU_OPENER = web.AppKey("gpu_opener", Callable[[], object])
REQUEST_ID = web.RequestKey("request_id", str)


def build_app(settings: Settings) -> web.Application:
    """The proxy as an aiohttp application (start it with `proxy.server.run` or a test client)."""
    app = web.Application(middlewares=[error_middleware], client_max_size=settings.max_body_bytes)
    app[SETTINGS] = settings
    app[RECORDS] = RecentRecords()
    if settings.embedded:
        app.cleanup_ctx.append(_embedded_upstream)
    app.cleanup_ctx.append(_telemetry)  # before the upstream: torn down after it, so the log flushes last
    app.cleanup_ctx.append(_upstream_client)
    app.on_response_prepare.append(_add_request_id)
    app.router.add_post("/v1/completions", completions)
    app.router.add_post("/infill", infill)
    app.router.add_post("/completion", llamacpp_completion)
    app.router.add_post("/api/generate", ollama_generate)
    app.router.add_get("/api/tags", ollama_tags)
    app.router.add_post("/api/show", ollama_show)
    app.router.add_get("/api/version", ollama_version)
    app.router.add_post("/v1/chat/completions", chat_completions)
    app.router.add_get("/v1/models", models)
    app.router.add_get("/health", health)
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/status", status)
    return app


async def _embedded_upstream(app: web.Application) -> AsyncIterator[None]:
    settings = app[SETTINGS]
    server = EmbeddedServer(
        settings.model, settings.embedded_ctx_tokens, settings.embedded_slots, settings.embedded_threads
    )
    url = await asyncio.to_thread(server.start)  # the model load blocks for a second or two
    log.info("embedded llama.cpp server at %s (model %s)", url, settings.model or "gemma-3-270m")
    print(f"embedded upstream: {url}", flush=True)
    app[EMBEDDED] = server
    yield
    await asyncio.to_thread(server.stop)


async def _upstream_client(app: web.Application) -> AsyncIterator[None]:
    settings = app[SETTINGS]
    base_url = app[EMBEDDED].url if EMBEDDED in app else settings.upstream
    timeout = aiohttp.ClientTimeout(total=None, sock_connect=settings.upstream_connect_timeout_ms / 1000)
    connector = aiohttp.TCPConnector(limit=0)  # concurrency is the policies' job, not the pool's
    async with aiohttp.ClientSession(timeout=timeout, connector=connector) as session:
        upstream = UpstreamClient(session, str(base_url))
        app[UPSTREAM] = upstream
        policies = app[POLICIES] = await build_policies(settings, upstream)
        telemetry = app[TELEMETRY]
        gpu = telemetry.gpu
        assert gpu is not None
        telemetry.metrics = ProxyMetrics(
            inflight=lambda: policies.admission.running,
            queued=lambda: policies.admission.depth,
            gpu_used=lambda: gpu.latest.used_bytes if gpu.latest and gpu.source == "nvml" else None,
            gpu_total=lambda: gpu.latest.total_bytes if gpu.latest and gpu.source == "nvml" else None,
        )
        budget = ContextBudget(budget_settings(settings), await build_counter(settings, upstream))
        log.info("context budget: %d tokens, tokenizer %s", settings.max_context_tokens, budget.counter.method)
        app[SERVICE] = CompletionService(upstream, policies, budget, telemetry)
        yield


def gpu_opener(settings: Settings, pid: int | None) -> Callable[[], NvmlBackend]:
    return lambda: NvmlBackend(settings.gpu, pid)


async def _telemetry(app: web.Application) -> AsyncIterator[None]:
    """The GPU sampler and the request log: started before requests, flushed after the last one."""
    settings = app[SETTINGS]
    pid = os.getpid() if EMBEDDED in app else (settings.upstream_pid or None)
    gpu = GpuSampler(app.get(GPU_OPENER) or gpu_opener(settings, pid), settings.vram_interval_ms / 1000)
    await asyncio.to_thread(gpu.open)
    sampler = asyncio.create_task(gpu.run(), name="gpu-sampler")
    log_file = recorder = None
    if settings.log is not None:
        log_file = JsonlLog(settings.log, int(settings.log_max_mb * 1024 * 1024))
        log_file.start()
    if settings.record is not None:
        recorder = JsonlLog(settings.record, int(settings.log_max_mb * 1024 * 1024))
        recorder.start()
    app[TELEMETRY] = Telemetry(app[RECORDS], gpu, log_file, log_content=settings.log_content, recorder=recorder)
    try:
        yield
    finally:
        sampler.cancel()
        await asyncio.gather(sampler, return_exceptions=True)
        gpu.close()
        for sink in (log_file, recorder):
            if sink is not None:
                await sink.close()


async def build_policies(settings: Settings, upstream: UpstreamClient) -> Policies:
    """The policies from the settings; `max_concurrency = 0` asks the upstream for its slot count."""
    limit = settings.max_concurrency
    if limit == 0:
        slots = await upstream.slot_count()
        limit = slots or 1
        why = f"the upstream's {slots} slots" if slots else "1 (the upstream did not say how many slots it has)"
        log.info("max_concurrency: %s", why)
    return Policies(
        debouncer=Debouncer(settings.debounce_ms / 1000),
        supersede=Supersede(settings.max_inflight),
        admission=AdmissionQueue(limit, settings.max_queue),
        ttft_timeout_ms=settings.ttft_timeout_ms,
        timeout_ms=settings.timeout_ms,
        complete_in_comments=settings.complete_in_comments,
    )


def budget_settings(settings: Settings) -> BudgetSettings:
    return BudgetSettings(
        max_context_tokens=settings.max_context_tokens,
        max_tokens=settings.max_tokens,
        prefix_ratio=settings.prefix_ratio,
        step_lines=settings.context_step_lines,
        template=template_for(settings.fim_template),
    )


async def build_counter(settings: Settings, upstream: UpstreamClient) -> TokenCounter:
    """`auto`: the upstream's /tokenize when it answers, else the calibrated character estimate."""
    choice = settings.tokenizer
    if choice == "chars":
        return CharsEstimator()
    if choice == "upstream":
        return UpstreamTokenizer(upstream)
    if choice != "auto":
        return await asyncio.to_thread(HfTokenizer, Path(choice))  # reading the file blocks
    tokenizer = UpstreamTokenizer(upstream)
    try:
        await tokenizer.count("x")
    except UpstreamError:
        return CharsEstimator()
    return tokenizer


async def _add_request_id(request: web.Request, response: web.StreamResponse) -> None:
    response.headers.setdefault("X-Request-Id", request_id(request))


def request_id(request: web.Request) -> str:
    if REQUEST_ID not in request:
        request[REQUEST_ID] = secrets.token_hex(8)
    return request[REQUEST_ID]


def json_error(error: ProxyError) -> web.Response:
    return web.Response(body=orjson.dumps(error_body(error)), status=error.status, content_type="application/json")


_HTTP_ERRORS: dict[int, type[ProxyError]] = {
    404: NotFoundError,
    405: MethodNotAllowedError,
    413: RequestTooLargeError,
}


@web.middleware
async def error_middleware(request: web.Request, handler: web.Handler) -> web.StreamResponse:
    """Every error leaves as JSON `{"error": {"message", "type"}}` with its status."""
    request_id(request)
    try:
        return await handler(request)
    except ProxyError as error:
        return json_error(error)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        error_cls = _HTTP_ERRORS.get(exc.status, InvalidRequestError)
        error = error_cls(f"{request.method} {request.path}: {exc.reason}")
        error.status = exc.status
        return json_error(error)
    except Exception:  # the one broad catch: log it whole, answer a sanitized 500
        log.exception("unhandled error in %s %s", request.method, request.path)
        return json_error(ProxyError("internal proxy error (see the proxy's log)"))


async def read_json(request: web.Request) -> object:
    body = await request.read()
    try:
        return orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise InvalidRequestError(f"request body is not valid JSON: {exc}") from exc


Parser = Callable[[Any, Mapping[str, str], str], NormalizedRequest]


async def _complete(
    request: web.Request, dialect: str, parse: Parser, writer_cls: type[StreamWriter]
) -> web.StreamResponse:
    """Parse in the dialect, serve through the one service, answer (and fail) in the dialect's shape."""
    service = request.app[SERVICE]
    rid = request_id(request)
    try:
        body = await read_json(request)
        normalized = parse(body, request.headers, rid)
    except InvalidRequestError as error:
        service.reject(NormalizedRequest(rid, dialect, openai.session_key(request.headers), ""), error)
        payload = orjson.dumps(writer_cls.error(error))
        return web.Response(body=payload, status=error.status, content_type="application/json")
    return await service.complete(normalized, writer_cls(request, normalized, body))


async def completions(request: web.Request) -> web.StreamResponse:
    return await _complete(request, openai.DIALECT, openai.parse_completion, openai.CompletionWriter)


async def infill(request: web.Request) -> web.StreamResponse:
    return await _complete(request, llamacpp.INFILL, llamacpp.parse_infill, llamacpp.LlamaCppWriter)


async def llamacpp_completion(request: web.Request) -> web.StreamResponse:
    return await _complete(request, llamacpp.COMPLETION, llamacpp.parse_completion, llamacpp.LlamaCppWriter)


async def ollama_generate(request: web.Request) -> web.StreamResponse:
    return await _complete(request, ollama.DIALECT, ollama.parse_generate, ollama.OllamaWriter)


async def ollama_tags(request: web.Request) -> web.Response:
    ids = ollama.model_ids(await request.app[UPSTREAM].get_json("/v1/models"))
    return web.json_response(ollama.tags(ids))


async def ollama_show(request: web.Request) -> web.Response:
    body = await read_json(request)
    name = body.get("model") or body.get("name") if isinstance(body, dict) else None
    ids = ollama.model_ids(await request.app[UPSTREAM].get_json("/v1/models"))
    if not isinstance(name, str) or not name:
        return web.json_response({"error": "'model' (or 'name') is required"}, status=400)
    return web.json_response(ollama.show(name if name in ids else (ids[0] if ids else name),
                                         request.app[SETTINGS].max_context_tokens))  # fmt: skip


async def ollama_version(request: web.Request) -> web.Response:
    return web.json_response({"version": ollama.OLLAMA_VERSION})


async def chat_completions(request: web.Request) -> web.StreamResponse:
    await read_json(request)  # bad JSON is our 400, not the upstream's
    return await forward(request, request.app[UPSTREAM], "/v1/chat/completions")


async def models(request: web.Request) -> web.StreamResponse:
    return await forward(request, request.app[UPSTREAM], "/v1/models")


async def health(request: web.Request) -> web.Response:
    upstream = request.app[UPSTREAM]
    reachable = await upstream.reachable()
    body = {
        "status": "ok" if reachable else "unavailable",
        "upstream": {"url": upstream.base_url, "reachable": reachable},
    }
    return web.json_response(body, status=200 if reachable else 503, dumps=lambda obj: orjson.dumps(obj).decode())


async def metrics(request: web.Request) -> web.Response:
    telemetry = request.app[TELEMETRY]
    assert telemetry.metrics is not None
    return web.Response(body=telemetry.metrics.render(), headers={"Content-Type": PROMETHEUS_CONTENT_TYPE})


async def status(request: web.Request) -> web.Response:
    """The live state: settings in force, upstream, per-session admissions, recent requests, VRAM."""
    app = request.app
    policies, gpu = app[POLICIES], app[TELEMETRY].gpu
    recent = list(app[RECORDS])[-20:]
    body = {
        "version": __version__,
        "settings": app[SETTINGS].model_dump(mode="json"),
        "upstream": {"url": app[UPSTREAM].base_url, "max_concurrency": policies.admission.limit},
        "inflight": policies.admission.running,
        "queued": policies.admission.depth,
        "debouncing": policies.debouncer.held(),
        "sessions": policies.supersede.sessions(),
        "recent": [
            {
                "id": r.id,
                "session": r.session,
                "outcome": r.outcome,
                "ttft_ms": r.ttft_ms,
                "total_ms": r.total_ms,
            }
            for r in recent
        ],
        "vram": vram_status(gpu),
    }
    return web.json_response(body, dumps=lambda obj: orjson.dumps(obj).decode())


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
