"""Running a coroutine in virtual time: a `looptime` event loop fast-forwards whenever every task
waits on a timer, so holds, deadlines and 1 ms token gaps cost no real time and do not depend on
how busy the machine is. The proxy's `Clock` reads the loop, so its records follow the same time."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Coroutine
from dataclasses import dataclass
from typing import Any, TypeVar

import aiohttp
import looptime
from aiohttp import web

from mellum_proxy.config import Settings
from mellum_proxy.http import build_app, serve_app

T = TypeVar("T")


def run_virtual(coro: Coroutine[Any, Any, T]) -> T:
    """Run `coro` to completion on a fresh virtual-time loop starting at t=0."""
    with asyncio.Runner(loop_factory=lambda: looptime.new_event_loop(start=0)) as runner:
        return runner.run(coro)


@contextlib.asynccontextmanager
async def proxy_before(upstream: web.Application, **settings: Any) -> AsyncIterator[ProxyClient]:
    """The proxy with `settings` in front of `upstream`, both on loopback ports, and a client session to it.
    Sockets work on the virtual-time loop: loopback writes are readable at once, so time moves only when every
    task waits on a timer (a debounce window, the gaps of a burst)."""
    async with serve_app(upstream) as upstream_url:
        app = build_app(Settings(upstream=upstream_url, **settings))
        async with serve_app(app) as url, aiohttp.ClientSession() as session:
            yield ProxyClient(session, url, app)


@dataclass
class ProxyClient:
    session: aiohttp.ClientSession
    url: str
    app: web.Application

    async def post(self, path: str, body: dict[str, Any], headers: dict[str, str] | None = None) -> Answer:
        """POST `body` as JSON; the status, the `X-Mellum-Outcome` header and the JSON answer."""
        async with self.session.post(self.url + path, json=body, headers=headers) as resp:
            return Answer(resp.status, resp.headers.get("X-Mellum-Outcome"), await resp.json())


@dataclass(frozen=True)
class Answer:
    status: int
    outcome: str | None
    body: Any
