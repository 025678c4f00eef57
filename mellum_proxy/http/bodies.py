"""Reading a request's JSON body: within `BODY_READ_S` (a client that trickles it holds a connection), and bad
JSON is the proxy's 400, in the route's dialect."""

from __future__ import annotations

import asyncio

import orjson
from aiohttp import web

from mellum_proxy.errors import InvalidRequestError, RequestTimeoutError

BODY_READ_S = 10.0  # for a request's body to arrive


async def read_json(request: web.Request) -> object:
    if request.content.is_eof():  # the whole body came with the headers (a keystroke's does): no wait, no timer
        body = await request.read()
    else:
        try:
            async with asyncio.timeout(BODY_READ_S):
                body = await request.read()
        except TimeoutError as exc:
            raise RequestTimeoutError(f"the request body did not arrive within {BODY_READ_S:.0f} s") from exc
    try:
        return orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise InvalidRequestError(f"request body is not valid JSON: {exc}") from exc
