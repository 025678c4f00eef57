"""The floors `bench overhead` compares the proxy with: two relays in the same frame.

- `bare_relay`: the smallest honest relay. It forwards `POST /v1/completions` and pipes the answer back
  as it arrives, with no parsing, policy or record; nothing a real proxy could do with less work.
- `parsing_relay`: the least a proxy with a record must do. It parses the request's JSON, writes the
  upstream body itself and splits the answer into events with the proxy's own reader
  (`mellum_proxy.upstream.sse.read_sse`), passing them on as the upstream sent them. No policy, budget, record
  or dialect: the difference between this path and the proxy is what those cost.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable

import aiohttp
import orjson
from aiohttp import web

from mellum_proxy.dialects.openai import DONE
from mellum_proxy.upstream.sse import read_sse

UPSTREAM = web.AppKey("upstream", str)
SESSION = web.AppKey("session", aiohttp.ClientSession)
_JSON = {"Content-Type": "application/json"}
Relay = Callable[[web.Request], Awaitable[web.StreamResponse]]


def bare_relay(upstream: str) -> web.Application:
    return _relay_app(upstream, _pipe)


def parsing_relay(upstream: str) -> web.Application:
    return _relay_app(upstream, _parse)


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


async def _parse(request: web.Request) -> web.StreamResponse:
    payload = orjson.loads(await request.read())
    payload["stream"] = True
    payload["stream_options"] = {"include_usage": True}
    url = request.app[UPSTREAM] + "/v1/completions"
    async with request.app[SESSION].post(url, data=orjson.dumps(payload), headers=_JSON) as resp:
        out = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await out.prepare(request)
        async for batch in read_sse(resp.content.iter_any()):
            await out.write(b"".join([b"data: " + (chunk.raw or b"") + b"\n\n" for chunk in batch]))
        await out.write_eof(DONE)
        return out
