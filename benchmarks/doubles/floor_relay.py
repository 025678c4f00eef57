"""The independent floor `benchmarks overhead` measures the proxy against: a parsing relay written without anything of
`mellum_proxy` (no import of it, on purpose), so that it does not move when the proxy's own code does.

It does what any proxy that records its requests must: parse the request's JSON and write the upstream body, then
split the upstream's answer into events at each network read and parse each event's JSON, passing the events on as
they came. Nothing else: no policy, budget, record or dialect.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable

import aiohttp
import orjson
from aiohttp import web

FLOOR_UPSTREAM = web.AppKey("floor_upstream", str)
FLOOR_SESSION = web.AppKey("floor_session", aiohttp.ClientSession)
HEADERS = {"Content-Type": "application/json"}


def floor_relay(upstream: str) -> web.Application:
    return relay_app(upstream, _relay)


def relay_app(upstream: str, relay: Callable[[web.Request], Awaitable[web.StreamResponse]]) -> web.Application:
    """`POST /v1/completions` handled by `relay`, with the upstream's URL and a session of its own in the app."""
    app = web.Application()
    app[FLOOR_UPSTREAM] = upstream
    app.cleanup_ctx.append(_session)
    app.router.add_post("/v1/completions", relay)
    return app


async def _session(app: web.Application) -> AsyncIterator[None]:
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
        app[FLOOR_SESSION] = session
        yield


async def _relay(request: web.Request) -> web.StreamResponse:
    payload = orjson.loads(await request.read())
    payload["stream"] = True
    url = request.app[FLOOR_UPSTREAM] + "/v1/completions"
    async with request.app[FLOOR_SESSION].post(url, data=orjson.dumps(payload), headers=HEADERS) as resp:
        out = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await out.prepare(request)
        tail = b""
        async for data in resp.content.iter_any():
            events = (tail + data).split(b"\n\n")
            tail = events.pop()  # an event not yet whole waits for the next read
            for event in events:
                if event.startswith(b"data: {"):
                    orjson.loads(event[6:])  # what a recording proxy reads of each event
            if events:
                await out.write(b"\n\n".join(events) + b"\n\n")
        if tail:
            await out.write(tail)
        await out.write_eof()
        return out


if __name__ == "__main__":  # in a process of its own: python -m benchmarks.doubles.floor_relay PORT UPSTREAM
    import sys

    web.run_app(floor_relay(sys.argv[2]), host="127.0.0.1", port=int(sys.argv[1]), print=None)
