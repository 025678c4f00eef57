"""Graceful shutdown: stop accepting, let in-flight requests finish within the grace period."""

from __future__ import annotations

import asyncio
import contextlib

import aiohttp
import pytest

from proxy.config import Settings
from proxy.http.server import serve
from proxy.upstream.embedded import EmbeddedServer
from tests.sse import collect_text, events

pytestmark = pytest.mark.embedded


async def test_in_flight_stream_finishes_after_stop(embedded_server: EmbeddedServer, unused_tcp_port: int) -> None:
    # The grace period is far longer than 40 tokens take on a busy machine: the test is about finishing
    # within it, not about how fast this machine decodes (5 s was not enough once, under load).
    settings = Settings(
        upstream=embedded_server.url,
        listen=f"127.0.0.1:{unused_tcp_port}",
        debounce_ms=0,
        timeout_ms=0,
        shutdown_timeout_s=60,
    )
    stop = asyncio.Event()
    server = asyncio.create_task(serve(settings, stop))
    url = f"http://{settings.listen}/v1/completions"
    body = {
        "prompt": "def add(a, b):\n",
        "temperature": 0,
        "max_tokens": 40,
        "stream": True,
        "ignore_eos": True,
    }
    try:
        async with aiohttp.ClientSession() as session:
            for _ in range(100):  # the server task needs a moment to bind; connecting is the signal
                with contextlib.suppress(aiohttp.ClientConnectorError):
                    resp = await session.post(url, json=body)
                    break
                await asyncio.sleep(0.05)
            first = await anext(events(resp))  # the request is in flight
            stop.set()
            text, seen = await collect_text(resp)
            assert seen[-1] == "[DONE]"  # finished, not cut off
            assert isinstance(first, dict)
            assert len(text) > 0
            await asyncio.wait_for(server, timeout=settings.shutdown_timeout_s + 5)
            with pytest.raises(aiohttp.ClientConnectorError):
                await session.post(url, json=body)
    finally:
        stop.set()
        await server
