"""Who may talk to the proxy: no web page, and with `--auth-token` only who holds the token.

The threat is a page in the developer's browser. It can send a "simple" cross-origin POST to a loopback
port (no preflight for `text/plain` or a form), and through DNS rebinding (its own name, re-pointed at
127.0.0.1) even read the answers. Editors and plugins are not browsers: they send no `Origin` and name
this machine in `Host`. So every route (`browser_guard`) refuses, with 403 in the route's dialect:
- a `Host` that is not an IP address, `localhost` or the name the proxy listens on (DNS rebinding);
- an `Origin` that is not the proxy's own (a page elsewhere; `null`: a sandboxed page or a file);
- `Sec-Fetch-Site` other than `same-origin` or `none` (what modern browsers say of a cross-site request);
- a `text/plain`, `multipart/form-data` or `application/x-www-form-urlencoded` body (what a page can send
  without asking first; no plugin does):
  415.
`--auth-token` guards everything besides, for a proxy that listens beyond this machine (then any `Host`
is accepted: the page cannot send the token).
"""

from __future__ import annotations

import base64
import hmac
import ipaddress

from aiohttp import web
from aiohttp.typedefs import Handler, Middleware

from mellum_proxy.errors import ForbiddenError, UnauthorizedError, UnsupportedMediaTypeError
from mellum_proxy.sections import ListenSection


def token_middleware(token: str) -> Middleware:
    """Every request must carry `Authorization: Bearer TOKEN` (only installed when a token is set); the live
    page (`/`, `/ui/...`) takes it as a browser sends it too, as HTTP Basic's password (any user name): the
    browser asks for it once and sends it with the page's own requests."""
    bearer = f"Bearer {token}".encode()
    password = token.encode()

    @web.middleware
    async def require_token(request: web.Request, handler: Handler) -> web.StreamResponse:
        given = request.headers.get("Authorization", "").encode("utf-8", "surrogateescape")
        if hmac.compare_digest(given, bearer) or hmac.compare_digest(_basic_password(given), password):
            return await handler(request)
        if request.path == "/" or request.path.startswith("/ui/"):
            body = b'{"error":{"message":"this page requires the proxy\'s --auth-token as its password"}}'
            ask = {"WWW-Authenticate": 'Basic realm="mellum-proxy", charset="UTF-8"'}
            return web.Response(status=401, body=body, content_type="application/json", headers=ask)
        raise UnauthorizedError("this proxy requires 'Authorization: Bearer <its --auth-token>'")

    return require_token


def _basic_password(header: bytes) -> bytes:
    """The password of an HTTP Basic `Authorization` header, or b"" when it is not one."""
    scheme, _, encoded = header.partition(b" ")
    if scheme.lower() != b"basic":
        return b""
    try:
        decoded = base64.b64decode(encoded.strip(), validate=True)
    except ValueError:
        return b""
    _, sep, secret = decoded.partition(b":")
    return secret if sep else b""


# CORS-safelisted: what a page sends cross-origin without a preflight
_PAGE_BODIES = ("text/plain", "multipart/form-data", "application/x-www-form-urlencoded")


def browser_guard(section: ListenSection) -> Middleware:
    """Refuse what a web page could make the developer's browser send (see the module docstring)."""
    listen_host = section.host.lower()
    any_host = bool(section.auth_token) and not section.loopback_only

    @web.middleware
    async def refuse_pages(request: web.Request, handler: Handler) -> web.StreamResponse:
        host = request.headers.get("Host")
        if not any_host and not host_allowed(host, listen_host):
            raise ForbiddenError(f"{request.path} answers only requests addressed to this machine (Host)")
        origin = request.headers.get("Origin")
        if origin is not None and not same_origin(origin, host):
            raise ForbiddenError("requests from web pages are refused (Origin)")
        if request.headers.get("Sec-Fetch-Site", "same-origin") not in ("same-origin", "none"):
            raise ForbiddenError("requests from web pages are refused (Sec-Fetch-Site)")
        if request.method == "POST" and request.content_type in _PAGE_BODIES:
            raise UnsupportedMediaTypeError(f"a {request.content_type} body is refused: send application/json")
        return await handler(request)

    return refuse_pages


def same_origin(origin: str, host: str | None) -> bool:
    """Whether `Origin` names the proxy itself: `http://` and the same host and port as `Host`."""
    scheme, sep, rest = origin.strip().lower().partition("://")
    return bool(sep) and scheme == "http" and host is not None and rest.rstrip("/") == host.strip().lower()


def check_host(request: web.Request, section: ListenSection) -> None:
    """Refuse a state read (`/status`, `/metrics`) addressed to a name that is not this machine's.

    Raises:
        ForbiddenError: the `Host` names another machine.
    """
    if not host_allowed(request.headers.get("Host"), section.host.lower()):
        raise ForbiddenError(f"{request.path} answers only requests addressed to this machine (Host)")


def host_allowed(host_header: str | None, listen_host: str) -> bool:
    """Whether a `Host` names this machine: no Host, an IP literal, `localhost`, or the listen name."""
    if not host_header:
        return True
    host = host_header.strip().lower()
    if host.startswith("["):
        host = host[1 : host.find("]")] if "]" in host else host
    else:
        host = host.rpartition(":")[0] if host.count(":") == 1 else host
    if host in ("localhost", listen_host) or host.endswith(".localhost"):
        return True
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True
