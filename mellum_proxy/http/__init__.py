"""The HTTP edge: the aiohttp app, its routes and error middleware, and the server runner.

It adapts the HTTP-free completion core (`mellum_proxy.serving.service`) to the wire; nothing below it
imports `aiohttp.web`.
"""

from mellum_proxy.http.app import build_app
from mellum_proxy.http.keys import (
    CONNECTIONS,
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
from mellum_proxy.http.server import serve, serve_app

__all__ = [
    "CONNECTIONS",
    "EMBEDDED",
    "GPU_OPENER",
    "POLICIES",
    "PROBES",
    "RECORDS",
    "SERVICE",
    "SETTINGS",
    "TELEMETRY",
    "UPSTREAM",
    "UPSTREAMS",
    "build_app",
    "serve",
    "serve_app",
]
