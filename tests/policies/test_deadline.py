"""Deadline on its own: absolute times on the clock, the first token never after the total."""

from __future__ import annotations

import math

from mellum_proxy.policies import Deadline


class FixedClock:
    def __init__(self, now: float) -> None:
        self._now = now

    def now(self) -> float:
        return self._now


def test_deadlines_count_from_now() -> None:
    deadline = Deadline.start(FixedClock(100.0), ttft_timeout_s=0.2, timeout_s=1.5)  # type: ignore[arg-type]
    assert deadline.first_token == 100.2 and deadline.total == 101.5


def test_zero_means_none() -> None:
    deadline = Deadline.start(FixedClock(5.0), ttft_timeout_s=None, timeout_s=None)  # type: ignore[arg-type]
    assert deadline.first_token == math.inf and deadline.total == math.inf


def test_the_first_token_deadline_is_never_after_the_total() -> None:
    only_total = Deadline.start(FixedClock(0.0), ttft_timeout_s=None, timeout_s=0.3)  # type: ignore[arg-type]
    assert only_total.first_token == only_total.total == 0.3
    longer_ttft = Deadline.start(FixedClock(0.0), ttft_timeout_s=0.9, timeout_s=0.3)  # type: ignore[arg-type]
    assert longer_ttft.first_token == 0.3
