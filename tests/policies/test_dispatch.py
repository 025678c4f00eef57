"""The adaptive hold: nothing while the upstream is idle, about one typing gap while it is busy."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest

from mellum_proxy.policies import Dispatch


class ManualClock:
    def __init__(self) -> None:
        self.t = 0.0

    def now(self) -> float:
        return self.t

    def unix(self) -> float:
        return self.t

    def call_later(self, delay_s: float, callback: Callable[..., object], *args: object) -> asyncio.TimerHandle:
        raise NotImplementedError


def _typed(dispatch: Dispatch, clock: ManualClock, gaps_s: list[float], busy: bool) -> float:
    hold = dispatch.hold_s("s", busy)
    for gap in gaps_s:
        clock.t += gap
        hold = dispatch.hold_s("s", busy)
    return hold


def test_idle_upstream_means_no_hold() -> None:
    clock = ManualClock()
    assert _typed(Dispatch(hold_busy_max_s=0.15, clock=clock), clock, [0.1, 0.1, 0.1], busy=False) == 0


def test_busy_upstream_holds_one_median_gap_up_to_the_cap() -> None:
    clock = ManualClock()
    hold = _typed(Dispatch(hold_busy_max_s=0.15, clock=clock), clock, [0.08, 0.12, 0.1], busy=True)
    assert hold == pytest.approx(0.1)
    clock = ManualClock()
    slow = _typed(Dispatch(hold_busy_max_s=0.15, clock=clock), clock, [0.4, 0.5, 0.6], busy=True)
    assert slow == pytest.approx(0.15)


def test_a_pause_does_not_count_as_rhythm_and_the_first_request_goes_at_once() -> None:
    clock = ManualClock()
    dispatch = Dispatch(hold_busy_max_s=5.0, clock=clock)
    assert dispatch.hold_s("s", busy=True) == 0  # no rhythm yet
    clock.t += 30.0
    assert dispatch.hold_s("s", busy=True) == pytest.approx(1.0)  # the pause counts as RHYTHM_CAP_S


def test_the_floor_holds_a_session_that_bursts_and_no_other() -> None:
    clock = ManualClock()
    dispatch = Dispatch(hold_min_s=0.002, clock=clock)

    def after(*gaps_s: float) -> float:
        for gap in gaps_s:
            clock.t += gap
            hold = dispatch.hold_s("s", busy=False)
        return hold

    assert dispatch.hold_s("s", busy=False) == 0  # no rhythm yet
    assert after(0.15, 0.2, 0.12) == 0  # steady typing: nothing to merge
    assert after(0.001) == 0.002  # edits arriving together: the next request is held to merge a burst
    assert after(*[0.15] * 7) == 0.002  # the burst is still among the last 8 gaps
    assert after(0.15) == 0  # and now it is not
