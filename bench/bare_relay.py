"""The smallest honest relay: what `bench overhead` compares the proxy with.

It forwards `POST /v1/completions` to the upstream and pipes the answer back as it arrives, with no
parsing, policy or record; nothing a real proxy could do with less work.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import aiohttp
from aiohttp import web

UPSTREAM = web.AppKey("upstream", str)
SESSION = web.AppKey("session", aiohttp.ClientSession)


def bare_relay(upstream: str) -> web.Application:
    app = web.Application()
    app[UPSTREAM] = upstream
    app.cleanup_ctx.append(_session)
    app.router.add_post("/v1/completions", _relay)
    return app


async def _session(app: web.Application) -> AsyncIterator[None]:
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
        app[SESSION] = session
        yield


async def _relay(request: web.Request) -> web.StreamResponse:
    body = await request.read()
    url = request.app[UPSTREAM] + "/v1/completions"
    async with request.app[SESSION].post(url, data=body, headers={"Content-Type": "application/json"}) as resp:
        out = web.StreamResponse(status=resp.status, headers={"Content-Type": resp.content_type})
        await out.prepare(request)
        async for data in resp.content.iter_any():
            await out.write(data)
        await out.write_eof()
        return out
