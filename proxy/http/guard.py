"""Who may talk to the proxy: an optional bearer token on every endpoint, and a `Host` check on the
endpoints that show its state.

`/status` and `/metrics` show settings, file paths and session ids. A web page the developer opens
can reach a loopback port through DNS rebinding (its own name, re-pointed at 127.0.0.1); the
request then carries that name as `Host`. So they answer only a `Host` that is an IP address,
`localhost`, or the name the proxy listens on. `--auth-token` guards everything, for a proxy that
listens beyond this machine.
"""

from __future__ import annotations

import hmac
import ipaddress

from aiohttp import web

from proxy.config import Settings
from proxy.errors import ForbiddenError, UnauthorizedError


def token_middleware(token: str) -> web.Middleware:
    """Every request must carry `Authorization: Bearer TOKEN` (only installed when a token is set)."""
    expected = f"Bearer {token}".encode()

    @web.middleware
    async def require_token(request: web.Request, handler: web.Handler) -> web.StreamResponse:
        given = request.headers.get("Authorization", "").encode("utf-8", "surrogateescape")
        if not hmac.compare_digest(given, expected):
            raise UnauthorizedError("this proxy requires 'Authorization: Bearer <its --auth-token>'")
        return await handler(request)

    return require_token


def check_host(request: web.Request, settings: Settings) -> None:
    """Refuse a state read (`/status`, `/metrics`) addressed to a name that is not this machine's.

    Raises:
        ForbiddenError: the `Host` names another machine.
    """
    if not host_allowed(request.headers.get("Host"), settings.listen_host.lower()):
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
