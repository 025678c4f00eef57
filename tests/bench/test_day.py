"""`benchmarks day` in small: two proxies sharing one log before a real llama.cpp that sleeps and restarts; every
answered request logged, the restart's next completion answered, the sleeps woken, nothing left behind."""

from __future__ import annotations

import pytest

from benchmarks.runners import day

pytestmark = [pytest.mark.slow, pytest.mark.embedded]  # real time and the real server: `make test` only


async def test_a_short_day_logs_every_answer_and_survives_sleep_and_restart(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(day, "BREAK_EVERY_S", 8.0)
    monkeypatch.setattr(day, "SAMPLE_EVERY_S", 10.0)
    result = await day.measure(minutes=0.6, typists=4, seed=2, progress=lambda line: None)
    assert result["answered"] > 50 and result["answered_not_logged"] == 0
    assert result["exit_codes"] == [0, 0] and result["stderr_tracebacks"] == 0
    assert result["restarts"] == 1 and result["after_restart"]["status"] == 200 and result["after_restart"]["text"]
    assert result["wakes"] >= 1  # the server slept in a break and a keystroke woke it
    last = result["samples"][-1]["proxies"]
    assert all(state["sessions"] == 0 and state["documents"] <= 8 for state in last.values())  # nothing held on
