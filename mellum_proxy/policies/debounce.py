"""`Debouncer`: hold each request of a session for a window; a newer one replaces the held one."""

from __future__ import annotations

import asyncio
import math
from dataclasses import dataclass

from pydantic import BaseModel, Field

from mellum_proxy.clock import LOOP_CLOCK, Clock
from mellum_proxy.models import NormalizedRequest
from mellum_proxy.observe import Changes
from mellum_proxy.policies.holds import HoldKind


class Debouncer:
    """Per-session debounce.

    `hold(session)` waits `window_s`. If another request of the same session calls `hold` meanwhile,
    the earlier call returns False at once (that request is `debounced` and never reaches the
    upstream) and the newer one starts its own window. A window of 0 disables it.
    """

    def __init__(self, window_s: float, clock: Clock = LOOP_CLOCK) -> None:
        self.window_s = window_s
        self.clock = clock
        self._held: dict[str, tuple[float, asyncio.Future[bool]]] = {}  # per session: its order, its outcome
        self.changes = Changes()

    def held(self) -> int:
        """Requests currently held (for status and tests)."""
        return len(self._held)

    async def hold(self, session: str, window_s: float | None = None, order: float = math.inf) -> bool:
        """Wait out the window (`window_s`, default the debouncer's). True: go on; False: a newer request
        of `session` replaced this one. A held request of the session is replaced even by a 0 window.
        `order`: when the request arrived; one that comes to the hold after a newer one of its session (it waited
        on something first) is replaced already: False at once, the newer one held on."""
        held = self._held.get(session)
        if held is not None and held[0] > order:
            return False
        if held is not None:
            del self._held[session]
            _resolve(held[1], False)
        window = self.window_s if window_s is None else window_s
        if window <= 0:
            return True
        mine: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        self._held[session] = (order, mine)
        self.changes.notify()
        timer = self.clock.call_later(window, _resolve, mine, True)
        try:
            return await mine
        finally:
            timer.cancel()
            if (entry := self._held.get(session)) is not None and entry[1] is mine:
                del self._held[session]
            self.changes.notify()


def _resolve(future: asyncio.Future[bool], value: bool) -> None:
    if not future.done():
        future.set_result(value)


class FixedSettings(BaseModel):
    debounce_ms: int = Field(
        150, ge=0, description="dispatch=fixed: hold each request this long (setting it alone selects fixed)."
    )


@dataclass(frozen=True, slots=True)
class FixedHold:
    """`dispatch = fixed`: every request held `window_s`, whatever the load."""

    window_s: float
    reads_load: bool = False

    def hold_for(self, request: NormalizedRequest, busy: bool) -> float:
        return self.window_s


def _fixed(settings: FixedSettings, clock: Clock) -> FixedHold:
    return FixedHold(settings.debounce_ms / 1000)


FIXED = HoldKind("fixed", _fixed, chosen_by=("debounce_ms",))
