"""`Foresight`: the dispatch hold that asks the pause model (`mellum_proxy.policies.pause_model`) whether the
person is about to stop typing.

Each request is sent at once when a pause is likely (its probability at least the session's threshold): the
person is about to look, and every millisecond held is theirs. One whose edit is likely followed by another
keystroke is held about as long as the session's next keystroke takes (the longest of its recent gaps under a
pause, plus `TYPING_MARGIN_S`; at most `hold_max_s`), and a newer request of the session replaces it for free.
A held request whose keystroke was the last one goes when the hold ends, late by the hold: the price of every
wrong guess. A busy upstream is left to the adaptive rule (`Dispatch`), as without foresight: there a waiting
request is replaced by the next one anyway. The burst floor (`hold_min_ms`) applies as in `adaptive`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from mellum_proxy.clock import LOOP_CLOCK, Clock
from mellum_proxy.models import NormalizedRequest
from mellum_proxy.policies.dispatch import Dispatch
from mellum_proxy.policies.pause_model import PauseModel

TYPING_MARGIN_S = 0.01


@dataclass(eq=False)
class Foresight:
    """Hold what is likely typed on, send what likely begins a pause."""

    base: Dispatch
    hold_max_s: float
    model: PauseModel = field(default_factory=PauseModel)
    clock: Clock = LOOP_CLOCK

    def hold_for(self, request: NormalizedRequest, busy: bool) -> float:
        """The hold for `request`, arriving now."""
        pause = self.model.likely_pause(request.session, self.clock.now(), request.prefix, request.suffix)
        base = self.base.hold_for(request, busy)
        if busy or pause:
            return base
        typing = self.model.typing_gap_s(request.session)
        hold = self.hold_max_s if typing is None else min(self.hold_max_s, typing + TYPING_MARGIN_S)
        return max(base, hold)

    def __str__(self) -> str:
        return f"foresight (hold {self.hold_max_s * 1000:.0f} ms when no pause is likely)"
