"""`Deadline`: absolute monotonic deadlines for one request, fixed when it is admitted."""

from __future__ import annotations

import math
from dataclasses import dataclass

from mellum_proxy.clock import Clock


@dataclass(frozen=True, slots=True)
class Deadline:
    """`first_token` and `total` in `Clock.now()` seconds (anyio's deadlines use the same); `inf` when off."""

    first_token: float
    total: float

    @classmethod
    def start(cls, clock: Clock, ttft_timeout_s: float | None, timeout_s: float | None) -> Deadline:
        """Deadlines counted from now; a timeout of None means none. Queue wait counts against both."""
        if ttft_timeout_s is None and timeout_s is None:
            return NO_DEADLINE  # nothing to count from: the clock is not read
        now = clock.now()
        total = now + timeout_s if timeout_s is not None else math.inf
        first = now + ttft_timeout_s if ttft_timeout_s is not None else math.inf
        return cls(first_token=min(first, total), total=total)


NO_DEADLINE = Deadline(first_token=math.inf, total=math.inf)
