"""Running a coroutine in virtual time: a `looptime` event loop fast-forwards whenever every task
waits on a timer, so holds, deadlines and 1 ms token gaps cost no real time and do not depend on
how busy the machine is. The proxy's `Clock` reads the loop, so its records follow the same time."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any, TypeVar

import looptime

T = TypeVar("T")


def run_virtual(coro: Coroutine[Any, Any, T]) -> T:
    """Run `coro` to completion on a fresh virtual-time loop starting at t=0."""
    with asyncio.Runner(loop_factory=lambda: looptime.new_event_loop(start=0)) as runner:
        return runner.run(coro)
