"""Endpoints the proxy forwards unchanged (chat completions, the model list): the upstream side.

`relay` opens the upstream request and hands the HTTP edge a `Relayed` answer whose body it pipes
back as it arrives. The response is closed (the socket dropped) when the edge stops reading early.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass

from proxy.upstream.client import UpstreamClient


@dataclass(frozen=True, slots=True)
class Relayed:
    status: int
    content_type: str
    charset: str | None
    body: AsyncIterator[bytes]


@asynccontextmanager
async def relay(
    upstream: UpstreamClient, method: str, path: str, body: bytes | None, content_type: str
) -> AsyncIterator[Relayed]:
    """Send one request to `path` on the upstream; read `body` inside the `async with`.

    Raises:
        UpstreamError: the upstream is unreachable or answered 4xx/5xx.
    """
    async with upstream.open(method, path, body, {"Content-Type": content_type}) as resp:
        yield Relayed(resp.status, resp.content_type, resp.charset, resp.content.iter_any())
