"""The warning a person gets when completions keep ending at the deadline before their first token."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest

from mellum_proxy.models import NormalizedRequest, Outcome
from mellum_proxy.telemetry.deadline_watch import DeadlineWatch
from mellum_proxy.telemetry.record import RequestRecord
from tests.conftest import ProxyFactory


def record(outcome: Outcome, ttft_ms: float | None = None, queue_ms: float = 0.0) -> RequestRecord:
    request = NormalizedRequest(id="r", route="openai", session="s", prefix="x")
    done = RequestRecord.start(request, 0.0, 0.0, False, False)
    done.outcome, done.ttft_ms, done.queue_ms = outcome, ttft_ms, queue_ms
    return done


def test_a_streak_of_timeouts_without_a_token_is_said_once_then_rate_limited() -> None:
    watch = DeadlineWatch(1500, in_a_row=3, every_s=300)
    assert watch.observe(record(Outcome.OK, ttft_ms=2100), 0) is None
    said = [watch.observe(record(Outcome.TIMEOUT), t) for t in (1, 2, 3, 4, 5)]
    assert said[:2] == [None, None] and said[3:] == [None, None]
    assert said[2] is not None
    assert "timeout_ms=1500" in said[2] and "took 2100 ms" in said[2] and "raise timeout_ms" in said[2]
    assert watch.observe(record(Outcome.TIMEOUT), 400) is not None  # five minutes later, again


def test_a_token_in_time_or_a_timeout_after_one_breaks_the_streak() -> None:
    watch = DeadlineWatch(1500, in_a_row=3)
    for _ in range(2):
        watch.observe(record(Outcome.TIMEOUT), 0)
    watch.observe(record(Outcome.TIMEOUT, ttft_ms=900), 0)  # cut, but something showed: not this problem
    watch.observe(record(Outcome.OK, ttft_ms=300), 0)
    assert [watch.observe(record(Outcome.TIMEOUT), 0) for _ in range(2)] == [None, None]


def test_waiting_for_a_slot_points_at_the_queue() -> None:
    watch = DeadlineWatch(1000, in_a_row=1)
    assert "max_concurrency" in (watch.observe(record(Outcome.TIMEOUT, queue_ms=900), 0) or "")


async def test_the_proxy_warns_when_a_slow_server_never_makes_the_deadline(
    make_proxy: ProxyFactory, fake_upstream: Any, caplog: pytest.LogCaptureFixture
) -> None:
    _, url = await fake_upstream(first_token_delay_s=5.0, slots=3)
    proxy = await make_proxy(upstream=url, timeout_ms=200, tokenizer="chars", reuse=False)
    with caplog.at_level(logging.WARNING, "mellum_proxy"):
        for i in range(4):
            resp = await proxy.post("/v1/completions", json={"prompt": f"x{i}"}, headers={"X-Session-Id": str(i)})
            assert resp.headers["X-Mellum-Outcome"] == "timeout"
        await asyncio.sleep(0)
    warnings = [m for m in caplog.messages if "completions show nothing" in m]
    assert len(warnings) == 1 and "timeout_ms=200" in warnings[0]
