"""`bare_relay`, the lowest floor `benchmarks overhead` compares the proxy with: the smallest honest relay. It forwards
`POST /v1/completions` and pipes the answer back as it arrives, with no parsing, policy or record; nothing a real
proxy could do with less work. (The parsing floor is `floor_relay`, written without the package.)
"""

from __future__ import annotations

from aiohttp import web

from benchmarks.doubles.floor_relay import FLOOR_SESSION, FLOOR_UPSTREAM, relay_app

_JSON = {"Content-Type": "application/json"}


def bare_relay(upstream: str) -> web.Application:
    return relay_app(upstream, _pipe)


async def _pipe(request: web.Request) -> web.StreamResponse:
    body = await request.read()
    url = request.app[FLOOR_UPSTREAM] + "/v1/completions"
    async with request.app[FLOOR_SESSION].post(url, data=body, headers=_JSON) as resp:
        out = web.StreamResponse(status=resp.status, headers={"Content-Type": resp.content_type})
        await out.prepare(request)
        async for data in resp.content.iter_any():
            await out.write(data)
        await out.write_eof()
        return out
