"""The one replay engine: a trace typed out on a clock, each edit handed to an editor.

`bench replay` runs it on the real event loop (real time, a real plugin over HTTP); `bench lab` runs it
on `looptime`'s loop (virtual time, the proxy's service in-process). Either way the gaps are the
trace's, longer ones shortened to `max_gap_ms` (a pause stays a pause), and every edit is marked with
the time it happened, for `mellum_proxy.tuning.workloads.editor.account`.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable, Sequence
from typing import Protocol

from mellum_proxy.tuning.workloads.editor import EditMark
from mellum_proxy.tuning.workloads.trace import Documents, Edit, Event

METRICS_PERIOD_S = 0.1  # how often a replay reads the server's `/metrics` (the lab's simulated server, likewise)


class Clock:
    """Milliseconds since it was made, on the running loop's clock: real, or `looptime`'s virtual one."""

    def __init__(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._start = self._loop.time()

    def now_ms(self) -> float:
        return (self._loop.time() - self._start) * 1000

    async def until(self, at_ms: float) -> None:
        """Sleep until `at_ms` after the start (at once if that has passed)."""
        await asyncio.sleep(max(0.0, self._start + at_ms / 1000 - self._loop.time()))


class Editor(Protocol):
    """What the typing is handed to: a simulated plugin (HTTP) or the lab's editor (in-process)."""

    def on_edit(self, index: int, file: str, text: str, cursor: int) -> None: ...

    def typed_on(self) -> None:
        """An edit it sends nothing for (the oracle's, between pauses): the person typed on, so the suggestion
        still on its way will not be shown; a plugin that cancels cancels it."""

    @property
    def in_flight(self) -> int: ...


def schedule(events: Sequence[Event], max_gap_ms: float) -> list[float]:
    """Replay times: gaps longer than `max_gap_ms` shortened to it."""
    times, last_in, last_out = [], None, 0.0
    for event in events:
        out = 0.0 if last_in is None else last_out + min(event.t_ms - last_in, max_gap_ms)
        times.append(out)
        last_in, last_out = event.t_ms, out
    return times


def gaps_after(events: Sequence[Event], max_gap_ms: float) -> dict[int, float]:
    """Each edit's position -> the gap to the next edit as played (the last edit: infinity)."""
    edits = [(position, at) for position, (event, at) in
             enumerate(zip(events, schedule(events, max_gap_ms), strict=True)) if isinstance(event, Edit)]  # fmt: skip
    return {position: following - at
            for (position, at), (_, following) in zip(edits, [*edits[1:], (None, math.inf)], strict=True)}  # fmt: skip


def pause_starts(events: Sequence[Event], max_gap_ms: float, pause_ms: float) -> set[int]:
    """The positions of the edits that begin a pause as played (the next edit `pause_ms` or more later, or
    none): where the oracle sends, and what `account` counts as pauses."""
    return {position for position, gap in gaps_after(events, max_gap_ms).items() if gap >= pause_ms}


async def play(
    events: Sequence[Event], max_gap_ms: float, editor: Editor, clock: Clock,
    progress: Callable[[int, int], None] | None = None, only: set[int] | None = None,
) -> list[EditMark]:  # fmt: skip
    """Type `events` out on `clock`, handing every edit (or those at the positions `only`, telling the editor
    of the others only that the person typed on) to `editor`; the edits' marks."""
    documents, marks = Documents(), []
    for position, (event, at) in enumerate(zip(events, schedule(events, max_gap_ms), strict=True)):
        await clock.until(at)
        documents.apply(event)
        if isinstance(event, Edit):
            marks.append(EditMark(position, event.file, clock.now_ms()))
            if only is None or position in only:
                editor.on_edit(position, event.file, documents.texts[event.file], documents.cursor[event.file])
            else:
                editor.typed_on()
        if progress:
            progress(position, editor.in_flight)
    return marks
