"""`AdmissionQueue`: at most `limit` requests upstream at once, a FIFO queue of at most `max_queue`.

A freed slot is handed straight to the oldest live waiter (no barging). A waiter whose cancel scope
was already cancelled (superseded, or past its deadline) no longer counts as queued: it is leaving,
and the request that replaced it must not be refused a place because of it.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass

import anyio

from mellum_proxy.observe import Changes


class QueueFullError(Exception):
    """No upstream slot and no room in the queue (an outcome, answered as an empty completion)."""


@dataclass(slots=True)
class _Waiter:
    future: asyncio.Future[None]
    scope: anyio.CancelScope | None

    @property
    def live(self) -> bool:
        return not self.future.done() and not (self.scope is not None and self.scope.cancel_called)


class Lease:
    """One held upstream slot. It may outlive the request that took it: a cancelled upstream request
    keeps its slot until the server has really let it go (see `mellum_proxy.serving.service`)."""

    __slots__ = ("_queue",)

    def __init__(self, queue: AdmissionQueue) -> None:
        self._queue: AdmissionQueue | None = queue

    def release(self) -> None:
        """Give the slot back (once; later calls do nothing)."""
        queue, self._queue = self._queue, None
        if queue is not None:
            queue._release()


class AdmissionQueue:
    def __init__(self, limit: int, max_queue: int) -> None:
        self.limit = max(1, limit)
        self.max_queue = max_queue
        self.running = 0
        self._waiters: deque[_Waiter] = deque()
        self.max_running_seen = 0
        self.max_depth_seen = 0
        self.changes = Changes()

    @property
    def depth(self) -> int:
        """Requests waiting for a slot."""
        return sum(1 for waiter in self._waiters if waiter.live)

    def resize(self, limit: int) -> None:
        """Allow `limit` requests upstream at once from now on; waiters get the slots that opened."""
        self.limit = max(1, limit)
        while self.running < self.limit and self._waiters:
            waiter = self._waiters.popleft()
            if waiter.live:
                self.running += 1
                waiter.future.set_result(None)
        self.changes.notify()

    def has_free_slot(self) -> bool:
        """A request would get a slot right now, without queueing."""
        return self.running < self.limit and self.depth == 0

    async def acquire(self, scope: anyio.CancelScope | None = None) -> Lease:
        """Take one upstream slot, waiting in the queue if none is free; `Lease.release()` gives it back.

        Args:
            scope: the request's cancel scope; once it is cancelled the request stops counting as queued.

        Raises:
            QueueFullError: every slot is taken and the queue is at `max_queue`.
        """
        if self.running < self.limit and self.depth == 0:
            self.running += 1
            self.changes.notify()
        else:
            await self._wait(scope)
        self.max_running_seen = max(self.max_running_seen, self.running)
        return Lease(self)

    @asynccontextmanager
    async def slot(self, scope: anyio.CancelScope | None = None) -> AsyncIterator[None]:
        """Hold one upstream slot for the body of the `async with` (see `acquire`)."""
        lease = await self.acquire(scope)
        try:
            yield
        finally:
            lease.release()

    async def _wait(self, scope: anyio.CancelScope | None) -> None:
        if self.depth >= self.max_queue:
            raise QueueFullError(f"{self.running} requests upstream and {self.depth} queued")
        waiter = _Waiter(asyncio.get_running_loop().create_future(), scope)
        self._waiters.append(waiter)
        self.changes.notify()
        self.max_depth_seen = max(self.max_depth_seen, self.depth)
        try:
            await waiter.future  # resolved by `_release`, which hands over its slot
        except BaseException:
            if waiter.future.done() and not waiter.future.cancelled():
                self._release()  # we were handed a slot but are leaving: pass it on
            elif waiter in self._waiters:
                self._waiters.remove(waiter)
                self.changes.notify()
            raise

    def _release(self) -> None:
        self.changes.notify()
        while self._waiters:
            waiter = self._waiters.popleft()
            if waiter.live:  # a waiter that is leaving removes itself; skip it
                waiter.future.set_result(None)  # the slot moves to the waiter; `running` is unchanged
                return
        self.running -= 1
