"""Reading a request's JSON body: within `BODY_READ_S` (a client that trickles it holds a connection), and bad
JSON is the proxy's 400, in the route's dialect.

A lone surrogate escape (`"\\ud800"`: what JavaScript's `JSON.stringify` writes when a plugin cuts a prompt inside
an emoji) is valid JSON that orjson refuses; such a body is read again by the standard library, its lone halves
made U+FFFD, and served. Only a body orjson refused pays for that.
"""

from __future__ import annotations

import asyncio
import json
import re

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
        try:  # NaN and Infinity stay refused, as orjson refuses them
            return repaired(json.loads(body.decode("utf-8", "replace"), parse_constant=_refused))
        except (ValueError, RecursionError):
            raise InvalidRequestError(f"request body is not valid JSON: {exc}") from exc


LONE_SURROGATE = re.compile("[\ud800-\udfff]")  # json.loads joins each valid pair into one character first


def _refused(constant: str) -> object:
    raise ValueError(f"{constant} is not JSON")


def repaired(value: object) -> object:
    """`value` with each lone surrogate in its strings (keys too) replaced by U+FFFD."""
    if isinstance(value, str):
        return LONE_SURROGATE.sub("\ufffd", value)
    if isinstance(value, list):
        return [repaired(item) for item in value]
    if isinstance(value, dict):
        return {repaired(key): repaired(item) for key, item in value.items()}
    return value
