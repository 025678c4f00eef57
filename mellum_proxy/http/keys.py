"""Typed keys for the state the HTTP edge keeps on the app and on each request."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from aiohttp import web

from mellum_proxy.config import Settings
from mellum_proxy.dialects import Dialect
from mellum_proxy.dialects.base import CompletionRoute
from mellum_proxy.discovery import Discovery
from mellum_proxy.http.connections import ConnectionGuard
from mellum_proxy.sections import Sections
from mellum_proxy.serving import CompletionService, Policies
from mellum_proxy.telemetry import RecentRecords, Telemetry
from mellum_proxy.upstream.client import UpstreamClient
from mellum_proxy.upstream.embedded import EmbeddedServer
from mellum_proxy.upstream.failover import Upstreams

SETTINGS = web.AppKey("settings", Settings)  # as the user wrote them (`/status` shows them)
SECTIONS = web.AppKey("sections", Sections)  # as the components take them
CONNECTIONS = web.AppKey("connections", ConnectionGuard)  # set when it listens through `serve`/`serve_app`
BOOTED = web.AppKey("booted", float)  # time.monotonic() when the app was built: "ready in N s"
UPSTREAM = web.AppKey("upstream", UpstreamClient)  # the primary upstream (what the probes ask)
UPSTREAMS = web.AppKey("upstreams", Upstreams)  # all of them, in order: the one serving answers
SERVICE = web.AppKey("service", CompletionService)
POLICIES = web.AppKey("policies", Policies)
RECORDS: web.AppKey[RecentRecords] = web.AppKey("records", RecentRecords)
TELEMETRY = web.AppKey("telemetry", Telemetry)
EMBEDDED = web.AppKey("embedded", EmbeddedServer)
PROBES = web.AppKey("probes", Discovery)
# Tests inject a GPU backend here (a fake, or one that is unavailable); production opens NVML.
GPU_OPENER: web.AppKey[Callable[[], Any]] = web.AppKey("gpu_opener")
# Which dialect owns each path (its error shape), and the completion route when it is one.
ROUTES = web.AppKey("routes", dict[str, tuple[Dialect, CompletionRoute | None]])

REQUEST_ID = web.RequestKey("request_id", str)
# Set once the completion service has the request: from then on it records the request itself.
RECORDED = web.RequestKey("recorded", bool)
# Set once a response has been prepared (its status and headers sent): an error after it ends the body
# in the dialect's own way instead, and the middleware must not answer a second time.
STARTED = web.RequestKey("started", bool)
