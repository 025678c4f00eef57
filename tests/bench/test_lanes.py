"""`benchmarks lanes`: the same load in four runs (alone, direct, no lanes, lanes), every chat completing answers."""

from __future__ import annotations

import pytest

from benchmarks.reporting.lanes_report import render
from benchmarks.runners.lanes import MODES, measure

pytestmark = pytest.mark.slow  # four runs of real time


async def test_four_runs_under_the_same_load_and_a_report() -> None:
    lines: list[str] = []
    result = await measure("sim:fast", seconds=1.5, every_ms=150, chats=2, chat_tokens=400, max_tokens=8,
                           progress=lines.append)  # fmt: skip
    assert list(result["modes"]) == list(MODES) and len(lines) == 4
    for mode, run in result["modes"].items():
        assert run["completions"] >= 5 and run["ttft_p95_ms"] is not None
        assert (run["chat_answers"] > 0) == (mode != "alone")  # every chat client completes answers
    report = render(result, "python -m benchmarks lanes")
    assert "| lanes |" in report and "Target" in report
