"""Debouncer: the newest request of a session survives; sessions keep their own windows.

Run in virtual time: the windows and arrival gaps are exact and cost no real time.
"""

from __future__ import annotations

import asyncio

from mellum_proxy.clock import LOOP_CLOCK
from mellum_proxy.policies import Debouncer
from tests.virtual_time import run_virtual


async def burst(debouncer: Debouncer, session: str, count: int, gap_s: float) -> list[asyncio.Task[bool]]:
    tasks = []
    for _ in range(count):
        tasks.append(asyncio.create_task(debouncer.hold(session)))
        await asyncio.sleep(gap_s)  # the arrival schedule, not synchronization
    return tasks


def test_burst_of_twenty_lets_only_the_last_through() -> None:
    async def main() -> tuple[list[bool], float]:
        debouncer = Debouncer(window_s=0.2)
        tasks = await burst(debouncer, "s", 20, 0.01)
        results = await asyncio.gather(*tasks)
        assert debouncer.held() == 0
        return results, LOOP_CLOCK.now()

    results, ended = run_virtual(main())
    assert results == [False] * 19 + [True]
    assert abs(ended - (19 * 0.01 + 0.2)) < 0.011  # the last one waited exactly its own window


def test_superseded_request_is_released_at_once() -> None:
    async def main() -> tuple[bool, float]:
        debouncer = Debouncer(window_s=30)
        first = asyncio.create_task(debouncer.hold("s"))
        await asyncio.sleep(0)  # let `first` start holding
        second = asyncio.create_task(debouncer.hold("s"))
        result = await first
        released_at = LOOP_CLOCK.now()
        second.cancel()
        await asyncio.gather(second, return_exceptions=True)
        return result, released_at

    result, released_at = run_virtual(main())
    assert result is False and released_at == 0  # not after 30 s: at once


def test_sessions_keep_their_own_windows() -> None:
    async def main() -> None:
        debouncer = Debouncer(window_s=0.15)
        a = await burst(debouncer, "a", 1, 0.01)
        b = await burst(debouncer, "b", 3, 0.01)
        a += await burst(debouncer, "a", 1, 0)
        assert await asyncio.gather(*a) == [False, True]
        assert await asyncio.gather(*b) == [False, False, True]

    run_virtual(main())


def test_zero_window_disables() -> None:
    async def main() -> tuple[bool, float]:
        return await Debouncer(window_s=0).hold("s"), LOOP_CLOCK.now()

    assert run_virtual(main()) == (True, 0)


def test_cancelled_hold_leaves_nothing_behind() -> None:
    async def main() -> int:
        debouncer = Debouncer(window_s=10)
        task = asyncio.create_task(debouncer.hold("s"))
        await asyncio.sleep(0)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        return debouncer.held()

    assert run_virtual(main()) == 0


def test_an_older_request_that_comes_late_does_not_replace_the_newer_one() -> None:
    """A keystroke that waited on something first (a completion it typed through) reaches the hold after a newer
    keystroke of its session: it is the one replaced, at once, and the newer one is held on to its end."""

    async def main() -> tuple[bool, bool, float]:
        debouncer = Debouncer(window_s=0.1)
        newer = asyncio.create_task(debouncer.hold("s", order=2))
        await asyncio.sleep(0.01)  # the arrival schedule
        older = await debouncer.hold("s", order=1)
        late_at = LOOP_CLOCK.now()
        return older, await newer, late_at

    older, newer, late_at = run_virtual(main())
    assert (older, newer) == (False, True) and late_at == 0.01  # replaced at once, not after its window
