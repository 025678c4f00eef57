"""The servers a benchmark runs against: the package's (a URL, `embedded`, `sim[:PROFILE]`) and `fast`, the
embedded llama.cpp on the fast model (`benchmarks.doubles.fast_model`)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

from mellum_proxy.console import fail
from mellum_proxy.tuning.runners import upstreams

PIN_HELP = (
    "the embedded server's threads (embedded, fast) on a core of their own, this process's on the others, "
    "as a GPU keeps the model's work off the proxy's CPU [default: off]"
)


@contextlib.asynccontextmanager
async def upstream_for(spec: str, pin_server: bool = False) -> AsyncIterator[tuple[str, str]]:
    """(URL, description) of the upstream: `fast`, else what `mellum_proxy.tuning.runners.upstreams` serves."""
    if spec != "fast":
        if pin_server and spec != "embedded":
            fail(f"--pin-server pins the embedded server's threads: it needs --upstream embedded or fast, not {spec}")
        async with upstreams.upstream_for(spec, pin_server) as served:
            yield served
        return
    from benchmarks.doubles.fast_model import FastShape, fast_model
    from mellum_proxy.upstream.embedded import EmbeddedServer

    shape = FastShape()
    model = await asyncio.to_thread(fast_model, shape)  # built once into the cache (about 13 s)
    server = EmbeddedServer(model, ctx_tokens=8192, slots=2)
    url = await asyncio.to_thread(server.start)
    try:
        described = f"embedded llama.cpp on the fast model ({shape.name}, random weights, 2 slots x 4096, CPU)"
        yield url, described + (upstreams.pinned(server) if pin_server else "")
    finally:
        await asyncio.to_thread(server.stop)
