"""`Clock`: the one place the completion core reads time.

Monotonic time is the running event loop's, so every hold, deadline, queue wait and record follows
the loop. Swap the loop for a fast-forwarding one (`looptime`, as the tests and the bench lab do)
and the policies run in virtual time: a 150 ms debounce costs no real time, and the durations the
records report are the virtual ones. `unix()` is only used to stamp records (`received_at`).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any, Protocol


class Clock(Protocol):
    def now(self) -> float:
        """Monotonic seconds; the same scale as the event loop's timers and anyio deadlines."""
        ...

    def unix(self) -> float:
        """Seconds since the epoch, for timestamps in records."""
        ...

    def call_later(self, delay_s: float, callback: Callable[..., Any], *args: Any) -> asyncio.TimerHandle:
        """Run `callback(*args)` after `delay_s` seconds on this clock."""
        ...


class LoopClock:
    """Time from the running event loop (real or virtual) and the system's wall clock."""

    __slots__ = ()

    def now(self) -> float:
        return asyncio.get_running_loop().time()

    def unix(self) -> float:
        return time.time()

    def call_later(self, delay_s: float, callback: Callable[..., Any], *args: Any) -> asyncio.TimerHandle:
        return asyncio.get_running_loop().call_later(delay_s, callback, *args)


LOOP_CLOCK = LoopClock()
