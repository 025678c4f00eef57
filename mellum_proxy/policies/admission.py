"""`AdmissionQueue`: at most `limit` requests upstream at once, a FIFO queue of at most `max_queue`.

A freed slot is handed straight to the oldest live waiter (no barging). A waiter whose cancel scope
was already cancelled (superseded, or past its deadline) no longer counts as queued: it is leaving,
and the request that replaced it must not be refused a place because of it.

Two lanes share the slots. Completions (this queue's own requests) may take any free slot. Bulk requests
(chat, agents, tools: whatever the proxy passes through) are counted against the same slots, but may hold at
most `bulk_limit` of them, so that `reserve` stay free for completions wherever the server has more slots than
that; they wait in a FIFO of their own (`max_bulk_queue`), behind any waiting completion, for at most the
time they are given, and a completion never cancels one that runs.
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

    __slots__ = ("_bulk", "_queue")

    def __init__(self, queue: AdmissionQueue, bulk: bool = False) -> None:
        self._queue: AdmissionQueue | None = queue
        self._bulk = bulk

    def release(self) -> None:
        """Give the slot back (once; later calls do nothing)."""
        queue, self._queue = self._queue, None
        if queue is not None:
            queue._release_bulk() if self._bulk else queue._release()


class AdmissionQueue:
    def __init__(self, limit: int, max_queue: int, reserve: int = 0, max_bulk_queue: int = 16) -> None:
        self.limit = max(1, limit)
        self.max_queue = max_queue
        self.reserve = max(0, reserve)  # slots bulk requests leave to completions (where there are more)
        self.max_bulk_queue = max_bulk_queue
        self.running = 0  # completions holding a slot
        self.bulk_running = 0  # bulk requests holding a slot
        self._waiters: deque[_Waiter] = deque()
        self._bulk_waiters: deque[_Waiter] = deque()
        self.max_running_seen = 0
        self.max_depth_seen = 0
        self.changes = Changes()

    @property
    def depth(self) -> int:
        """Completions waiting for a slot."""
        return sum(1 for waiter in self._waiters if waiter.live)

    @property
    def bulk_depth(self) -> int:
        """Bulk requests waiting for a slot."""
        return sum(1 for waiter in self._bulk_waiters if waiter.live)

    @property
    def bulk_limit(self) -> int:
        """The most slots bulk requests may hold: all but `reserve`, where the server has more than that."""
        return self.limit - self.reserve if self.limit > self.reserve else self.limit

    def _free(self) -> bool:
        return self.running + self.bulk_running < self.limit

    def resize(self, limit: int) -> None:
        """Allow `limit` requests upstream at once from now on; waiters get the slots that opened."""
        self.limit = max(1, limit)
        while self._free() and self._waiters:
            waiter = self._waiters.popleft()
            if waiter.live:
                self.running += 1
                waiter.future.set_result(None)
        self._admit_bulk()
        self.changes.notify()

    def has_free_slot(self) -> bool:
        """A request would get a slot right now, without queueing."""
        return self._free() and self.depth == 0

    async def acquire(self, scope: anyio.CancelScope | None = None) -> Lease:
        """Take one upstream slot, waiting in the queue if none is free; `Lease.release()` gives it back.

        Args:
            scope: the request's cancel scope; once it is cancelled the request stops counting as queued.

        Raises:
            QueueFullError: every slot is taken and the queue is at `max_queue`.
        """
        if self._free() and self.depth == 0:
            self.running += 1
            self.changes.notify()
        else:
            await self._wait(scope)
        self.max_running_seen = max(self.max_running_seen, self.running)
        return Lease(self)

    async def acquire_bulk(self, timeout_s: float | None) -> Lease:
        """Take one slot for a bulk request, within `bulk_limit` and behind every waiting completion, waiting in
        the bulk queue for at most `timeout_s` (None: as long as it takes).

        Raises:
            QueueFullError: no slot for it and the bulk queue is at `max_bulk_queue`.
            TimeoutError: no slot came within `timeout_s`.
        """
        if self._bulk_may_run() and self.bulk_depth == 0:
            self.bulk_running += 1
            self.changes.notify()
            return Lease(self, bulk=True)
        if self.bulk_depth >= self.max_bulk_queue:
            raise QueueFullError(f"{self.bulk_running} bulk requests upstream and {self.bulk_depth} waiting")
        waiter = _Waiter(asyncio.get_running_loop().create_future(), None)
        self._bulk_waiters.append(waiter)
        self.changes.notify()
        try:
            async with asyncio.timeout(timeout_s):
                await waiter.future  # resolved by `_admit_bulk`, which counts it as running
        except BaseException:
            if waiter.future.done() and not waiter.future.cancelled():
                self._release_bulk()  # handed a slot, but leaving: pass it on
            elif waiter in self._bulk_waiters:
                self._bulk_waiters.remove(waiter)
                self.changes.notify()
            raise
        return Lease(self, bulk=True)

    def _bulk_may_run(self) -> bool:
        return self._free() and self.bulk_running < self.bulk_limit and self.depth == 0

    def _admit_bulk(self) -> None:
        """Hand free slots to waiting bulk requests, as far as the lanes allow."""
        while self._bulk_waiters and self._bulk_may_run():
            waiter = self._bulk_waiters.popleft()
            if waiter.live:
                self.bulk_running += 1
                waiter.future.set_result(None)

    def _release_bulk(self) -> None:
        self.bulk_running -= 1
        self.changes.notify()
        while self._waiters and self._free():  # a waiting completion first
            waiter = self._waiters.popleft()
            if waiter.live:
                self.running += 1
                waiter.future.set_result(None)
        self._admit_bulk()

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
        self._admit_bulk()
