"""`bare_relay`, the lowest floor `bench overhead` compares the proxy with: the smallest honest relay. It forwards
`POST /v1/completions` and pipes the answer back as it arrives, with no parsing, policy or record; nothing a real
proxy could do with less work. (The parsing floor is `floor_relay`, written without the package.)
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable

import aiohttp
from aiohttp import web

UPSTREAM = web.AppKey("upstream", str)
SESSION = web.AppKey("session", aiohttp.ClientSession)
_JSON = {"Content-Type": "application/json"}
Relay = Callable[[web.Request], Awaitable[web.StreamResponse]]


def bare_relay(upstream: str) -> web.Application:
    return _relay_app(upstream, _pipe)


def _relay_app(upstream: str, relay: Relay) -> web.Application:
    app = web.Application()
    app[UPSTREAM] = upstream
    app.cleanup_ctx.append(_session)
    app.router.add_post("/v1/completions", relay)
    return app


async def _session(app: web.Application) -> AsyncIterator[None]:
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
        app[SESSION] = session
        yield


async def _pipe(request: web.Request) -> web.StreamResponse:
    body = await request.read()
    url = request.app[UPSTREAM] + "/v1/completions"
    async with request.app[SESSION].post(url, data=body, headers=_JSON) as resp:
        out = web.StreamResponse(status=resp.status, headers={"Content-Type": resp.content_type})
        await out.prepare(request)
        async for data in resp.content.iter_any():
            await out.write(data)
        await out.write_eof()
        return out
