"""`Changes`: a synchronous "state changed" signal that async code can wait on.

Policies and the record store call `notify()` when their state changes; `/status` watchers and
tests wait with `wait_for(predicate)` instead of polling.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable


class Changes:
    __slots__ = ("_event",)

    def __init__(self) -> None:
        self._event = asyncio.Event()

    def notify(self) -> None:
        """Wake every waiter (callable from sync code on the event loop's thread)."""
        self._event.set()  # wakes every waiter (their futures are resolved now), and is ready for the next
        self._event.clear()

    async def wait_for(self, predicate: Callable[[], bool], timeout_s: float = 5.0) -> None:
        """Return once `predicate()` holds; raise `TimeoutError` after `timeout_s` (a safety net)."""
        async with asyncio.timeout(timeout_s):
            while not predicate():
                await self._event.wait()
