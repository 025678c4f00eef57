"""`Dispatch`: how long to hold each request before it may go upstream.

`fixed` holds every request `debounce_ms`. `adaptive` (the default) decides per request from two
things the proxy already knows:

- the session's typing rhythm: the median of its last gaps between requests (each capped at
  `RHYTHM_CAP_S`, so a pause does not count as rhythm);
- whether the upstream is busy: no free slot right now, or this session still has a request
  admitted or a cancelled one the server has not let go of.

While a session's recent gaps show edits arriving together (auto-indent, a closed bracket,
multi-cursor: a gap of at most `hold_min_ms`, default 2 ms), each of its requests is held at least
that long, so that a burst makes one request; a session that has not burst lately, and a session's
first request, are not held for it: on a fast idle server those 2 ms were the whole difference
from going direct (docs/measurements/runs/lab). Beyond that, an idle upstream
gets the request at once (`hold_idle_max_ms`, default 0): waiting could only make the suggestion
later, and a newer keystroke still supersedes it. A busy upstream may get it after about one typing
gap (`hold_gap_factor` x the median gap, at most `hold_busy_max_ms`), but that is off by default
(`hold_busy_max_ms=0`): in the lab it gained nothing with a plugin that cancels, and with one that does
not it made p95 worse (docs/measurements/runs/lab-nocancel). A busy upstream coalesces keystrokes by itself: a
request waiting for a slot is replaced by the next one for free (`Supersede`).
"""

from __future__ import annotations

import statistics
from collections import OrderedDict, deque
from dataclasses import dataclass, field

from pydantic import BaseModel, Field

from mellum_proxy.clock import LOOP_CLOCK, Clock
from mellum_proxy.models import NormalizedRequest
from mellum_proxy.policies.holds import HoldKind

RHYTHM_CAP_S = 1.0
RHYTHM_GAPS = 8
MAX_SESSIONS = 1024


@dataclass(eq=False)
class Dispatch:
    """`dispatch = adaptive`: the hold from the session's typing rhythm and the upstream's load."""

    reads_load = True  # (not a field)

    hold_idle_max_s: float = 0.0
    hold_busy_max_s: float = 0.0
    gap_factor: float = 1.0
    clock: Clock = LOOP_CLOCK
    hold_min_s: float = 0.0
    _rhythm: OrderedDict[str, tuple[float, deque[float]]] = field(default_factory=OrderedDict, init=False, repr=False)

    @property
    def max_hold_s(self) -> float:
        """The longest hold this policy can choose (0: it never holds, and never reads the clock)."""
        return max(self.hold_idle_max_s, self.hold_busy_max_s, self.hold_min_s)

    def hold_for(self, request: NormalizedRequest, busy: bool) -> float:
        """The hold for `request`, arriving now."""
        return self.hold_s(request.session, busy)

    def hold_s(self, session: str, busy: bool) -> float:
        """The hold for a request of `session` arriving now."""
        if self.max_hold_s <= 0:
            return 0.0
        gaps = self._observe(session)
        if not gaps:
            return 0.0  # no rhythm yet: the first request of a session goes at once
        floor = self.hold_min_s if min(gaps) <= self.hold_min_s else 0.0  # the session bursts: merge a burst
        cap = self.hold_busy_max_s if busy else self.hold_idle_max_s
        return max(floor, min(cap, self.gap_factor * statistics.median(gaps)))

    def _observe(self, session: str) -> deque[float]:
        """Note this arrival; the session's recent gaps (empty before its second request)."""
        now = self.clock.now()
        entry = self._rhythm.pop(session, None)
        gaps: deque[float] = entry[1] if entry else deque(maxlen=RHYTHM_GAPS)
        if entry is not None:
            gaps.append(min(RHYTHM_CAP_S, now - entry[0]))
        self._rhythm[session] = (now, gaps)
        if len(self._rhythm) > MAX_SESSIONS:
            self._rhythm.popitem(last=False)
        return gaps


class AdaptiveSettings(BaseModel):
    hold_idle_max_ms: int = Field(0, ge=0, description="adaptive: longest hold while the upstream is idle.")
    hold_busy_max_ms: int = Field(0, ge=0, description="adaptive: longest hold while the upstream is busy.")
    hold_min_ms: int = Field(
        2, ge=0, description="adaptive: a session whose edits arrive this close together is held this long."
    )
    hold_gap_factor: float = Field(1.0, ge=0, le=10, description="adaptive: hold = this x the median typing gap.")


def _adaptive(settings: AdaptiveSettings, clock: Clock) -> Dispatch:
    return Dispatch(settings.hold_idle_max_ms / 1000, settings.hold_busy_max_ms / 1000, settings.hold_gap_factor,
                    clock, settings.hold_min_ms / 1000)  # fmt: skip


ADAPTIVE = HoldKind("adaptive", _adaptive)
