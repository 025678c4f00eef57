"""AdmissionQueue: bounded concurrency, bounded FIFO queue, cancelled waiters leave."""

from __future__ import annotations

import asyncio

import anyio
import pytest

from mellum_proxy.policies import AdmissionQueue, QueueFullError


async def occupy(queue: AdmissionQueue, started: list[str], name: str, release: asyncio.Event) -> str:
    async with queue.slot():
        started.append(name)
        await release.wait()
    return name


async def test_limit_queue_and_fifo_order() -> None:
    queue = AdmissionQueue(limit=1, max_queue=2)
    release = asyncio.Event()
    started: list[str] = []
    tasks = [asyncio.create_task(occupy(queue, started, name, release)) for name in "abc"]
    await asyncio.sleep(0)  # one loop turn: every task reaches the queue
    assert (queue.running, queue.depth) == (1, 2)
    with pytest.raises(QueueFullError):
        async with queue.slot():
            pass
    release.set()
    assert await asyncio.gather(*tasks) == ["a", "b", "c"]
    assert started == ["a", "b", "c"]
    assert (queue.running, queue.depth, queue.max_running_seen, queue.max_depth_seen) == (0, 0, 1, 2)


async def test_cancelled_waiter_leaves_the_queue() -> None:
    queue = AdmissionQueue(limit=1, max_queue=1)
    release = asyncio.Event()
    started: list[str] = []
    first = asyncio.create_task(occupy(queue, started, "a", release))
    second = asyncio.create_task(occupy(queue, started, "b", release))
    await asyncio.sleep(0)
    second.cancel()
    await asyncio.gather(second, return_exceptions=True)
    assert queue.depth == 0
    third = asyncio.create_task(occupy(queue, started, "c", release))
    await asyncio.sleep(0)
    release.set()
    await asyncio.gather(first, third)
    assert started == ["a", "c"]
    assert queue.running == 0


async def test_waiter_whose_scope_is_cancelled_no_longer_counts() -> None:
    queue = AdmissionQueue(limit=1, max_queue=1)
    release = asyncio.Event()
    scope = anyio.CancelScope()

    async def superseded() -> None:
        with scope:
            async with queue.slot(scope):
                raise AssertionError("a superseded request must never get a slot")

    holder = asyncio.create_task(occupy(queue, [], "a", release))
    waiter = asyncio.create_task(superseded())
    await asyncio.sleep(0)
    assert queue.depth == 1
    scope.cancel()  # synchronous: the place is free before the waiter task has even run
    assert queue.depth == 0
    async with asyncio.timeout(2):
        release.set()
        await asyncio.gather(holder, waiter)
    assert queue.running == 0


async def test_a_larger_limit_lets_waiters_in_at_once_and_a_smaller_one_drains() -> None:
    queue = AdmissionQueue(limit=1, max_queue=4)
    release = asyncio.Event()
    started: list[str] = []
    tasks = [asyncio.create_task(occupy(queue, started, name, release)) for name in "abc"]
    await asyncio.sleep(0)
    assert (queue.running, queue.depth) == (1, 2)
    queue.resize(3)  # the upstream turned out to have 3 slots
    await asyncio.sleep(0)
    assert (queue.running, queue.depth, started) == (3, 0, ["a", "b", "c"])
    queue.resize(1)  # fewer: nobody is stopped, but no new request starts until running < 1
    assert not queue.has_free_slot()
    release.set()
    await asyncio.gather(*tasks)
    assert (queue.running, queue.depth) == (0, 0) and queue.has_free_slot()


async def test_bulk_requests_leave_the_reserve_to_completions_and_wait_in_order() -> None:
    """Two slots, one reserved: one chat runs, the second waits in the proxy; a completion takes the free slot at
    once; a completion that waits is served before a waiting chat; a running chat is never taken back."""
    queue = AdmissionQueue(limit=2, max_queue=4, reserve=1, max_bulk_queue=1)
    first_chat = await queue.acquire_bulk(None)
    second_chat = asyncio.create_task(queue.acquire_bulk(None))
    await asyncio.sleep(0)
    assert (queue.bulk_running, queue.bulk_depth) == (1, 1)
    with pytest.raises(QueueFullError):  # the bulk queue is full
        await queue.acquire_bulk(None)
    assert queue.has_free_slot()  # the reserve
    completion = await queue.acquire()
    assert (queue.running, queue.bulk_running) == (1, 1)
    waiting_completion = asyncio.create_task(queue.acquire())
    await asyncio.sleep(0)
    first_chat.release()  # the slot goes to the waiting completion, not to the waiting chat
    second_lease = await asyncio.wait_for(waiting_completion, 1)
    assert (queue.running, queue.bulk_running, queue.bulk_depth) == (2, 0, 1) and not second_chat.done()
    completion.release()
    chat_lease = await asyncio.wait_for(second_chat, 1)  # a slot and within the bulk limit: it runs
    assert (queue.running, queue.bulk_running) == (1, 1)
    for lease in (second_lease, chat_lease):
        lease.release()
    assert (queue.running, queue.bulk_running, queue.depth, queue.bulk_depth) == (0, 0, 0, 0)


async def test_a_bulk_request_waits_no_longer_than_it_is_given() -> None:
    queue = AdmissionQueue(limit=1, max_queue=1, reserve=1)
    held = await queue.acquire()
    with pytest.raises(TimeoutError):
        await queue.acquire_bulk(0.01)
    assert queue.bulk_depth == 0
    held.release()
    lease = await queue.acquire_bulk(0.01)  # one slot: the reserve does not apply, bulk may use it
    assert queue.bulk_running == 1 and not queue.has_free_slot()
    lease.release()


def test_the_reserve_applies_only_where_the_server_has_more_slots() -> None:
    assert AdmissionQueue(limit=1, max_queue=1, reserve=1).bulk_limit == 1
    assert AdmissionQueue(limit=2, max_queue=1, reserve=1).bulk_limit == 1
    assert AdmissionQueue(limit=4, max_queue=1, reserve=1).bulk_limit == 3
    assert AdmissionQueue(limit=4, max_queue=1, reserve=0).bulk_limit == 4
