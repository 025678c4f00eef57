"""Typing in bursts, for the replay tests."""

from __future__ import annotations

from typing import Any

from mellum_proxy.tuning.workloads.trace import Edit, Open


def burst_trace() -> list[Any]:
    """Three bursts of 8 keystrokes 40 ms apart, separated by 600 ms pauses."""
    events: list[Any] = [Open(0, "app.py", "def main():\n    ")]
    t, offset = 0, 16
    for _ in range(3):
        for _ in range(8):
            t += 40
            events.append(Edit(t, "app.py", offset, 0, "x"))
            offset += 1
        t += 600
    return events
