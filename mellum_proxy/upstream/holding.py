"""What the server holds now, running and queued, as its kind says it (`ServerKind.held_gauges` on `/metrics`,
llama.cpp's `/slots` where `/metrics` is off), and the wait until a cancelled request's slot is let go."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Protocol

import aiohttp
import orjson

from mellum_proxy.upstream.metrics import held_from_metrics
from mellum_proxy.upstream.servers import ServerKind, holding_kinds

LET_GO_POLL_S = 0.01


class Upstream(Protocol):
    session: aiohttp.ClientSession
    kind: ServerKind

    def url(self, path: str) -> str: ...


class Holding:
    """One upstream's held count; the source that answered is kept (None: the server cannot say)."""

    def __init__(self, upstream: Upstream) -> None:
        self.upstream = upstream
        self.source: str | None = ""  # "": not probed yet

    async def held(self) -> int | None:
        """Requests the server holds now; None if it cannot say."""
        for source in [self.source] if self.source else ["/metrics", "/slots"]:
            try:
                timeout = aiohttp.ClientTimeout(total=1)
                async with self.upstream.session.get(self.upstream.url(source), timeout=timeout) as resp:
                    if resp.status >= 400:
                        continue
                    text = await resp.text()
            except (aiohttp.ClientError, TimeoutError):
                return None
            held = self._read(source, text)
            if held is not None:
                self.source = source
                return held
        if self.source == "":
            self.source = None
        return None

    def _read(self, source: str, text: str) -> int | None:
        kinds = holding_kinds(self.upstream.kind)
        if source == "/metrics":
            return held_from_metrics(text, [kind.held_gauges for kind in kinds])
        if not any(kind.holds_in_slots for kind in kinds):
            return None
        try:
            slots = orjson.loads(text)
        except orjson.JSONDecodeError:
            return None
        if not isinstance(slots, list):
            return None
        return sum(1 for slot in slots if isinstance(slot, dict) and slot.get("is_processing"))

    async def let_go(self, accept: Callable[[int], bool], timeout_s: float) -> bool:
        """Wait until `accept(requests the server holds)` is true; False when the server cannot say (or
        `timeout_s` passed first). Polled every `LET_GO_POLL_S`: only cancelled requests wait on this."""
        if self.source is None:
            return False
        loop = asyncio.get_running_loop()
        until = loop.time() + timeout_s
        while loop.time() < until:
            now = await self.held()
            if now is None:
                return False
            if accept(now):
                return True
            await asyncio.sleep(LET_GO_POLL_S)
        return False
