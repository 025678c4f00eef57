"""The one place an error becomes an HTTP answer: in the route's dialect, and recorded.

Every `ProxyError`, every aiohttp HTTP error (404, 405, 413, ...) and every unexpected exception
leaves as the dialect's own error body with its status: OpenAI `{"error": {"message", "type"}}`,
llama.cpp `{"error": {"code", "message", "type"}}`, Ollama `{"error": "message"}`. A completion
request that fails before the service had it is recorded here (`bad_request`); once the service
has it, the service records it.
"""

from __future__ import annotations

import itertools
import logging
import secrets

import orjson
from aiohttp import web
from aiohttp.typedefs import Handler

from mellum_proxy.dialects import DEFAULT, Dialect
from mellum_proxy.dialects.base import session_key
from mellum_proxy.errors import (
    InvalidRequestError,
    MethodNotAllowedError,
    NotFoundError,
    ProxyError,
    RequestTooLargeError,
)
from mellum_proxy.http.keys import RECORDED, REQUEST_ID, ROUTES, STARTED, TELEMETRY
from mellum_proxy.models import NormalizedRequest

log = logging.getLogger("mellum_proxy")

_HTTP_ERRORS: dict[int, type[ProxyError]] = {
    404: NotFoundError,
    405: MethodNotAllowedError,
    413: RequestTooLargeError,
}


_ID_PREFIX = secrets.token_hex(4)  # random per process; the counter makes each id unique within it
_ID_COUNTER = itertools.count(1)


def request_id(request: web.Request) -> str:
    """16 hex digits, unique per process run, without a call into the OS's random source per request."""
    if REQUEST_ID not in request:
        request[REQUEST_ID] = f"{_ID_PREFIX}{next(_ID_COUNTER) & 0xFFFFFFFF:08x}"
    return request[REQUEST_ID]


def render_error(dialect: Dialect, error: ProxyError) -> web.Response:
    body = orjson.dumps(dialect.error_body(error))
    return web.Response(body=body, status=error.status, content_type="application/json")


def as_proxy_error(request: web.Request, exc: BaseException) -> ProxyError:
    """What `exc` means to the client; anything unexpected is logged whole and becomes a sanitized 500."""
    if isinstance(exc, ProxyError):
        return exc
    if isinstance(exc, web.HTTPException):
        error = _HTTP_ERRORS.get(exc.status, InvalidRequestError)(f"{request.method} {request.path}: {exc.reason}")
        error.status = exc.status
        return error
    log.exception("unhandled error in %s %s", request.method, request.path, exc_info=exc)
    return ProxyError("internal proxy error (see the proxy's log)")


@web.middleware
async def error_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    rid = request_id(request)
    try:
        return await handler(request)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        error = as_proxy_error(request, exc)
    except Exception as exc:  # the one broad catch: every error leaves in the route's own shape
        if request.get(STARTED, False):
            # The status line is on the wire: a second response would corrupt the body. The handler ends
            # bodies itself; reaching here is a defect, and aiohttp drops the connection after it.
            log.exception("error after the answer started in %s %s", request.method, request.path, exc_info=exc)
            raise
        error = as_proxy_error(request, exc)
    dialect, route = request.app[ROUTES].get(request.path, (DEFAULT, None))
    if route is not None and not request.get(RECORDED, False):
        stub = NormalizedRequest(rid, route.name, session_key(request.headers), "")
        request.app[TELEMETRY].reject(stub, error)
    return render_error(dialect, error)
