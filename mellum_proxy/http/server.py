"""Running an app on a socket: `serve_app` (any app, a loopback port by default, for the bench and
tests too) and `serve` (the proxy in the foreground until SIGINT/SIGTERM).

Shutdown: for `ACCEPT_AFTER_STOP_S` after the signal the proxy goes on serving, so that a request
already on the wire (sent, not yet read) is answered and logged rather than cut off; then it stops
accepting, lets the completions in flight finish within `shutdown_timeout_s`, answers each one still
open with what it has and its dialect's final event (outcome `shutdown`), cancels and awaits the
service's own tasks, and only then runs aiohttp's shutdown (what is left: pass-through streams and idle
connections, within `LEFTOVER_S`) and the cleanup contexts (upstream session, embedded server, request
log).
"""

from __future__ import annotations

import asyncio
import errno
import os
import signal
import socket
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from aiohttp import web

from mellum_proxy.config import Settings
from mellum_proxy.http.app import build_app
from mellum_proxy.http.connections import IDLE_TIMEOUT_S, ConnectionGuard, accept_batch
from mellum_proxy.http.keys import CONNECTIONS, SECTIONS, UPSTREAMS
from mellum_proxy.http.malformed import quiet_malformed_requests
from mellum_proxy.upstream.local_servers import find_local_server

ACCEPT_AFTER_STOP_S = 0.2  # requests sent just before the signal still arrive in this window
# The kernel's queue of connections not accepted yet. asyncio sets it to its `backlog`, the few it accepts a turn
# (`accept_batch`); a burst past that had its SYNs dropped, and its clients retried after 1, 3, 7, 15 s (74 waited
# over 10 s at a file limit of 128) instead of being accepted and answered 503 at once.
LISTEN_BACKLOG = socket.SOMAXCONN
LEFTOVER_S = 1.0  # after the completions are answered: for anything else still open (a pass-through stream)


@asynccontextmanager
async def serve_app(
    app: web.Application, host: str = "127.0.0.1", port: int = 0, shutdown_timeout_s: float = 5.0
) -> AsyncIterator[str]:
    """Serve `app` on `host:port` (0: a free port) for the body of the `async with`; yields its URL."""
    runner = web.AppRunner(app, handler_cancellation=True, shutdown_timeout=shutdown_timeout_s, access_log=None,
                           keepalive_timeout=idle_timeout_s(app))  # fmt: skip
    await runner.setup()
    listener: asyncio.Server | None = None
    try:
        listener = await listen(runner, host, port)
        bound_host, bound_port = listener.sockets[0].getsockname()[:2]
        shown = f"[{bound_host}]" if ":" in bound_host else bound_host
        yield f"http://{shown}:{bound_port}"
    finally:
        if listener is not None:
            listener.close()
        await runner.cleanup()


def idle_timeout_s(app: web.Application) -> float:
    """How long a client's idle keep-alive connection stays open: the proxy's `idle_timeout_ms`, else the
    guard's default (any other app: the bench's doubles)."""
    return app[SECTIONS].listen.idle_timeout_s if SECTIONS in app else IDLE_TIMEOUT_S


async def listen(runner: web.AppRunner, host: str, port: int, sock: socket.socket | None = None) -> asyncio.Server:
    """Accept connections for `runner`'s app through a `ConnectionGuard` (its counts go to `/status`), on `sock`
    when it is bound already, else on `host:port`."""
    assert runner.server is not None, "runner.setup() first"
    quiet_malformed_requests()
    guard = runner.app.get(CONNECTIONS) or ConnectionGuard()
    guard.factory = runner.server
    loop = asyncio.get_running_loop()
    if sock is not None:
        server = await loop.create_server(guard, sock=sock, backlog=accept_batch())
    else:
        server = await loop.create_server(guard, host, port, reuse_address=True, backlog=accept_batch())
    for listening in server.sockets:  # asyncio's backlog is also how many it accepts a turn: the kernel's is ours
        with socket.socket(listening.family, listening.type, fileno=os.dup(listening.fileno())) as same:
            same.listen(LISTEN_BACKLOG)
    return server


def bind(host: str, port: int) -> socket.socket:
    """The proxy's listening socket, bound before anything slow starts (a model loading).

    Raises:
        OSError: the address is taken or cannot be had, in one line that names `--listen`.
    """
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
        family, kind, proto, _, address = infos[0]
        sock = socket.socket(family, kind, proto)
    except OSError as exc:
        raise OSError(f"cannot listen on {host}:{port}: {exc.strerror or exc}; choose another with --listen") from exc
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
    except OSError as exc:
        sock.close()
        taken = " (another program, or another mellum-proxy, uses it)" if exc.errno == errno.EADDRINUSE else ""
        raise OSError(f"cannot listen on {host}:{port}: {exc.strerror or exc}{taken}; "
                      "choose another with --listen HOST:PORT") from exc  # fmt: skip
    sock.setblocking(False)
    return sock


async def _started(runner: web.AppRunner, stop: asyncio.Event) -> bool:
    """Set up `runner` (the model loads, the upstream is found, its prompt warmed); False when `stop` came first:
    Ctrl-C during start-up stops it there, with no "ready" said and no port opened."""
    setup = asyncio.ensure_future(runner.setup())
    stopped = asyncio.ensure_future(stop.wait())
    await asyncio.wait({setup, stopped}, return_when=asyncio.FIRST_COMPLETED)
    stopped.cancel()
    if not setup.done():
        setup.cancel()
        await asyncio.gather(setup, return_exceptions=True)
        return False
    setup.result()  # its error, if any (a model that will not load)
    return True


async def serve(settings: Settings, stop: asyncio.Event | None = None) -> None:
    """Serve until `stop` is set or a termination signal arrives."""
    sock = bind(settings.listen_host, settings.listen_port)  # a taken port is said before a model loads
    if not settings.loopback_only:  # said as soon as the port is bound
        reach = "with --auth-token required" if settings.auth_token else "WITHOUT a token (set --auth-token)"
        print(f"mellum-proxy: WARNING: listening on {settings.listen_host}, beyond this machine, "
              f"{reach}; completions carry source code", file=sys.stderr, flush=True)  # fmt: skip
    if "upstream" not in settings.model_fields_set and not settings.embedded:
        found, said = await find_local_server()
        print(f"mellum-proxy: {said}", flush=True)
        if found is not None:
            settings = settings.model_copy(update={"upstream": (found,)})
    stop = stop or asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        loop.add_signal_handler(signum, stop.set)
    app = build_app(settings)
    runner = web.AppRunner(app, handler_cancellation=True, shutdown_timeout=LEFTOVER_S, access_log=None,
                           keepalive_timeout=idle_timeout_s(app))  # fmt: skip
    try:
        if not await _started(runner, stop):
            print("mellum-proxy: stopped while starting", flush=True)
            return
        listener = await listen(runner, settings.listen_host, settings.listen_port, sock)
        upstream = " then ".join(member.client.shown_url for member in app[UPSTREAMS].members)
        print(f"mellum-proxy listening on http://{settings.listen} -> upstream {upstream}", flush=True)
        await stop.wait()
        print("mellum-proxy: shutting down", flush=True)
        await asyncio.sleep(ACCEPT_AFTER_STOP_S)
        listener.close()  # no new connection from here on; the grace is the runner's shutdown step
    finally:
        await runner.cleanup()
        sock.close()
        for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            loop.remove_signal_handler(signum)
