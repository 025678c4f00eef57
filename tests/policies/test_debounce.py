"""Debouncer: the newest request of a session survives; sessions keep their own windows."""

from __future__ import annotations

import asyncio

from proxy.policies import Debouncer


async def burst(debouncer: Debouncer, session: str, count: int, gap_s: float) -> list[asyncio.Task[bool]]:
    tasks = []
    for _ in range(count):
        tasks.append(asyncio.create_task(debouncer.hold(session)))
        await asyncio.sleep(gap_s)  # the arrival schedule, not synchronization
    return tasks


async def test_burst_of_twenty_lets_only_the_last_through() -> None:
    debouncer = Debouncer(window_s=0.2)
    tasks = await burst(debouncer, "s", 20, 0.01)
    results = await asyncio.gather(*tasks)
    assert results == [False] * 19 + [True]
    assert debouncer.held() == 0


async def test_superseded_request_is_released_at_once() -> None:
    debouncer = Debouncer(window_s=30)
    first = asyncio.create_task(debouncer.hold("s"))
    await asyncio.sleep(0)  # let `first` start holding
    second = asyncio.create_task(debouncer.hold("s"))
    assert await asyncio.wait_for(first, timeout=1) is False  # not after 30 s: at once
    second.cancel()


async def test_sessions_keep_their_own_windows() -> None:
    debouncer = Debouncer(window_s=0.15)
    a = await burst(debouncer, "a", 1, 0.01)
    b = await burst(debouncer, "b", 3, 0.01)
    a += await burst(debouncer, "a", 1, 0)
    assert await asyncio.gather(*a) == [False, True]
    assert await asyncio.gather(*b) == [False, False, True]


async def test_zero_window_disables() -> None:
    debouncer = Debouncer(window_s=0)
    assert await asyncio.wait_for(debouncer.hold("s"), timeout=0.5) is True


async def test_cancelled_hold_leaves_nothing_behind() -> None:
    debouncer = Debouncer(window_s=10)
    task = asyncio.create_task(debouncer.hold("s"))
    await asyncio.sleep(0)
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    assert debouncer.held() == 0
