"""Run the proxy in the foreground until SIGINT/SIGTERM, then shut down in aiohttp's order:
stop accepting, let in-flight requests finish within `shutdown_timeout_s`, cancel the rest,
close the upstream session (and the embedded server)."""

from __future__ import annotations

import asyncio
import signal

from aiohttp import web

from proxy.app import UPSTREAM, build_app
from proxy.config import Settings


async def serve(settings: Settings, stop: asyncio.Event | None = None) -> None:
    """Serve until `stop` is set or a termination signal arrives."""
    stop = stop or asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    app = build_app(settings)
    runner = web.AppRunner(
        app, handler_cancellation=True, shutdown_timeout=settings.shutdown_timeout_s, access_log=None
    )
    await runner.setup()
    try:
        site = web.TCPSite(runner, settings.listen_host, settings.listen_port)
        await site.start()
        print(
            f"mellum-proxy listening on http://{settings.listen} -> upstream {app[UPSTREAM].base_url}",
            flush=True,
        )
        await stop.wait()
        print("mellum-proxy: shutting down", flush=True)
    finally:
        await runner.cleanup()
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(signum)
