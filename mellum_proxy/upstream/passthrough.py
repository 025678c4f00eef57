"""Endpoints the proxy forwards unchanged (chat completions, the model list): the upstream side.

`relay` opens the upstream request and hands the HTTP edge a `Relayed` answer whose body it pipes
back as it arrives. The response is closed (the socket dropped) when the edge stops reading early.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass

import aiohttp

from mellum_proxy.upstream.client import UpstreamClient
from mellum_proxy.upstream.errors import translate_errors


@dataclass(frozen=True, slots=True)
class Relayed:
    status: int
    content_type: str
    charset: str | None
    body: AsyncIterator[bytes]


@asynccontextmanager
async def relay(
    upstream: UpstreamClient, method: str, path: str, body: bytes | None, content_type: str, silence_s: float | None
) -> AsyncIterator[Relayed]:
    """Send one request to `path` on the upstream; read `body` inside the `async with`.

    The upstream may be silent (no answer, no byte) for at most `silence_s` (None or 0: no limit).

    Raises:
        UpstreamError: the upstream is unreachable, answered 4xx/5xx, or was silent too long
            (`UpstreamTimeoutError`; also while the body is read).
    """
    limit = aiohttp.ClientTimeout(total=None, sock_read=silence_s or None)
    headers = {"Content-Type": content_type, **upstream.routing()}
    async with upstream.open(method, path, body, headers, limit) as resp:
        yield Relayed(resp.status, resp.content_type, resp.charset, _translated(upstream.shown_url + path, resp))


async def _translated(url: str, resp: aiohttp.ClientResponse) -> AsyncIterator[bytes]:
    """The body as it arrives; a failure while reading it is an `UpstreamError` like any other."""
    with translate_errors(url):
        async for data in resp.content.iter_any():
            yield data
