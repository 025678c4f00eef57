"""The server a bench command runs against: a URL, the embedded llama.cpp server, or the simulator."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING

import aiohttp

from mellum_proxy.console import fail
from mellum_proxy.proc import pin_apart
from mellum_proxy.upstream.health import server_problem, unreachable_line
from mellum_proxy.urls import upstream_base_url

if TYPE_CHECKING:
    from mellum_proxy.upstream.embedded import EmbeddedServer


PIN_HELP = (
    "the embedded server's threads (embedded) on a core of their own, this process's on the others, "
    "as a GPU keeps the model's work off the proxy's CPU [default: off]"
)


@contextlib.asynccontextmanager
async def upstream_for(spec: str, pin_server: bool = False) -> AsyncIterator[tuple[str, str]]:
    """(URL, description) of the upstream: a URL, `embedded` or `sim[:PROFILE]` (the project's benchmarks add
    `fast`, the embedded llama.cpp on a small random-weights model: `benchmarks.upstreams`).

    `pin_server`: the embedded server's threads on cores of their own and this process's (the proxy's, the
    simulated plugins') on the others, as a GPU keeps the model's work off the proxy's CPU; only for `embedded`
    (one line and exit 2 for another)."""
    if pin_server and spec != "embedded":
        fail(f"--pin-server pins the embedded server's threads: it needs --upstream embedded, not {spec}")
    if spec == "embedded":
        from mellum_proxy.upstream.embedded import EmbeddedServer

        server = EmbeddedServer(ctx_tokens=4096, slots=2)
        url = await asyncio.to_thread(server.start)
        try:
            described = "embedded llama.cpp (gemma-3-270m Q4_K_M, 2 slots x 2048 tokens, CPU)"
            yield url, described + (pinned(server) if pin_server else "")
        finally:
            await asyncio.to_thread(server.stop)
    elif spec.startswith("sim"):
        from mellum_proxy.http import serve_app
        from mellum_proxy.tuning.sim.server import SimServer, profile

        chosen = profile(spec.partition(":")[2] or "embedded-cpu")
        async with serve_app(SimServer(chosen).app()) as url:
            yield url, f"sim:{chosen.name} ({chosen.source})"
    else:
        url = upstream_base_url(spec)
        problem = await server_problem(url)
        if problem is not None:
            fail(unreachable_line(url, problem))  # one line and exit 2, before a replay of zeros
        yield url, spec


def pinned(server: EmbeddedServer) -> str:
    """Pin `server`'s threads apart from this process's (`pin_server`); how the description says so."""
    try:
        theirs, ours = pin_apart(server.thread_ids, server.threads)
    except ValueError as exc:
        fail(f"--pin-server: {exc}")
    return f"; its threads on CPU {_cpus(theirs)}, the bench and proxy on {_cpus(ours)}"


def _cpus(cpus: set[int]) -> str:
    return ",".join(str(cpu) for cpu in sorted(cpus))


async def context_limit(url: str) -> int | None:
    """Context per request, as the server's kind says it (`mellum_proxy.upstream.servers.discover`)."""
    from mellum_proxy.upstream.client import UpstreamClient
    from mellum_proxy.upstream.servers import discover

    async with aiohttp.ClientSession() as session:
        return (await discover(UpstreamClient(session, url))).context
