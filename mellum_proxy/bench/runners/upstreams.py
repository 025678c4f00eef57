"""The server a bench command runs against: a URL, the embedded llama.cpp server, or the simulator."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import aiohttp

from mellum_proxy.console import fail
from mellum_proxy.upstream.health import server_problem, unreachable_line
from mellum_proxy.urls import upstream_base_url


@contextlib.asynccontextmanager
async def upstream_for(spec: str) -> AsyncIterator[tuple[str, str]]:
    """(URL, description) of the upstream: a URL, `embedded`, `fast` (the embedded llama.cpp on the fast model,
    `mellum_proxy.bench.doubles.fast_model`), or `sim[:PROFILE]`."""
    if spec == "fast":
        from mellum_proxy.bench.doubles.fast_model import FastShape, fast_model
        from mellum_proxy.upstream.embedded import EmbeddedServer

        shape = FastShape()
        model = await asyncio.to_thread(fast_model, shape)  # built once into the cache (about 13 s)
        server = EmbeddedServer(model, ctx_tokens=8192, slots=2)
        url = await asyncio.to_thread(server.start)
        try:
            yield url, f"embedded llama.cpp on the fast model ({shape.name}, random weights, 2 slots x 4096, CPU)"
        finally:
            await asyncio.to_thread(server.stop)
    elif spec == "embedded":
        from mellum_proxy.upstream.embedded import EmbeddedServer

        server = EmbeddedServer(ctx_tokens=4096, slots=2)
        url = await asyncio.to_thread(server.start)
        try:
            yield url, "embedded llama.cpp (gemma-3-270m Q4_K_M, 2 slots x 2048 tokens, CPU)"
        finally:
            await asyncio.to_thread(server.stop)
    elif spec.startswith("sim"):
        from mellum_proxy.bench.doubles.sim import SimServer, profile
        from mellum_proxy.http import serve_app

        chosen = profile(spec.partition(":")[2] or "embedded-cpu")
        async with serve_app(SimServer(chosen).app()) as url:
            yield url, f"sim:{chosen.name} ({chosen.source})"
    else:
        url = upstream_base_url(spec)
        problem = await server_problem(url)
        if problem is not None:
            fail(unreachable_line(url, problem))  # one line and exit 2, before a replay of zeros
        yield url, spec


async def context_limit(url: str) -> int | None:
    """Context per request, as the server's kind says it (`mellum_proxy.upstream.servers.discover`)."""
    from mellum_proxy.upstream.client import UpstreamClient
    from mellum_proxy.upstream.servers import discover

    async with aiohttp.ClientSession() as session:
        return (await discover(UpstreamClient(session, url))).context
