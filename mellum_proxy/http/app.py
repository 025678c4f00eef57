"""`build_app(settings)`: the proxy as an aiohttp application.

Client disconnects cancel the handler (`serve_app` runs with `handler_cancellation=True`): the
proxy exists to drop stale work, so a request whose editor has gone must stop the upstream too.
"""

from __future__ import annotations

import time

from aiohttp import web

from mellum_proxy.config import Settings
from mellum_proxy.http import lifecycle
from mellum_proxy.http.connections import ConnectionGuard
from mellum_proxy.http.guard import browser_guard, token_middleware
from mellum_proxy.http.keys import BOOTED, CONNECTIONS, RECORDS, SECTIONS, SETTINGS
from mellum_proxy.http.middleware import error_middleware, request_id
from mellum_proxy.http.page import add_page_routes
from mellum_proxy.http.routes import add_routes
from mellum_proxy.sections import sections
from mellum_proxy.telemetry import RecentRecords


def build_app(settings: Settings) -> web.Application:
    """The proxy's app: start it with `mellum_proxy.http.serve_app` or a test client."""
    tree = sections(settings)
    middlewares = [error_middleware, browser_guard(tree.listen)]  # the guard's refusals are rendered by the first
    if settings.auth_token:
        middlewares.append(token_middleware(settings.auth_token))  # its refusals are rendered by the first
    app = web.Application(middlewares=middlewares, client_max_size=settings.max_body_bytes)
    app[SETTINGS] = settings
    app[SECTIONS] = tree
    app[BOOTED] = time.monotonic()
    app[CONNECTIONS] = ConnectionGuard()  # counts for /status once it listens (`mellum_proxy.http.server.listen`)
    app[RECORDS] = RecentRecords()
    if settings.embedded:
        app.cleanup_ctx.append(lifecycle.embedded_upstream)
    app.cleanup_ctx.append(lifecycle.telemetry)  # before the upstream: torn down after it, so the log flushes last
    app.cleanup_ctx.append(lifecycle.upstream_client)
    app.on_shutdown.append(lifecycle.grace)  # one shutdown path: `serve`, `serve_app` and the tests take it
    app.on_response_prepare.append(_add_request_id)
    add_routes(app)
    add_page_routes(app)
    return app


async def _add_request_id(request: web.Request, response: web.StreamResponse) -> None:
    response.headers.setdefault("X-Request-Id", request_id(request))
