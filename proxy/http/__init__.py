"""The HTTP edge: the aiohttp app, its routes and error middleware, and the server runner.

It adapts the HTTP-free completion core (`proxy.completion`) to the wire; nothing below it
imports `aiohttp.web`.
"""

from proxy.http.app import build_app
from proxy.http.keys import (
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
from proxy.http.server import serve, serve_app

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
