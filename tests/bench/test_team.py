"""`bench replay --developers` and the pieces of `benchmarks team`: each developer's own proxy and routing key,
the worker relay's counts, and how a report reads failover and failures. (`benchmarks team` itself runs the
real vllm-router and three llama.cpp servers: its report is in docs/measurements/runs/team.)"""

from __future__ import annotations

from typing import Any

import aiohttp
import pytest

from benchmarks.reporting.team_report import failover_times, failures
from benchmarks.runners.team import Tap
from mellum_proxy.tuning.reporting.replay_report import developers_markdown
from mellum_proxy.tuning.reporting.results import PolicyResult
from mellum_proxy.tuning.runners.policy import parse_policy
from mellum_proxy.tuning.runners.replay import run_developers
from tests.bench.bursts import burst_trace

pytestmark = pytest.mark.slow  # seconds of real time: in `make test`, not in `make test-fast`


async def test_developers_replay_at_once_each_under_its_own_routing_key(sim_url: str) -> None:
    tap = Tap("worker-a", sim_url)
    await tap.start()
    try:
        events = burst_trace()
        results = await run_developers(parse_policy("proxy:tokenizer=chars"), [events, events, events], tap.url or "")
    finally:
        await tap.stop()
    assert [r.policy for r in results] == ["proxy/dev-1", "proxy/dev-2", "proxy/dev-3"]
    assert set(tap.by_key) == {"dev-1", "dev-2", "dev-3"}  # one routing key per developer, on every request
    for r in results:  # answered by it: the requests that got a first chunk before a newer keystroke came
        assert r.pause_coverage == 1.0 and set(r.served_by) == {tap.url}
        assert 0 < r.served_by[tap.url or ""] <= r.upstream_requests
    table = developers_markdown(results, {"dev-1": {"worker-a": 3}})
    assert "| proxy/dev-1 | 24 |" in table and "worker-a: 3" in table


async def test_a_stopped_tap_refuses_connections_like_a_dead_worker(sim_url: str) -> None:
    tap = Tap("worker-a", sim_url)
    url = await tap.start()
    async with aiohttp.ClientSession() as session:
        async with session.get(url + "/health") as resp:
            assert resp.status == 200
        await tap.stop()
        try:
            await session.get(url + "/health")
            raise AssertionError("a stopped tap answered")
        except aiohttp.ClientConnectorError:
            pass


def result(series: list[tuple[float, str | None, str, float]]) -> PolicyResult:
    fields: dict[str, Any] = {name: 0 for name in ("edits", "client_requests", "upstream_requests", "shown", "pauses",
                                                   "shown_completion_tokens", "timeouts", "errors", "max_queue_depth",
                                                   "max_inflight", "duration_s")}  # fmt: skip
    nones = ("pause_coverage", "latency_p50_ms", "latency_p95_ms", "upstream_prompt_tokens",
             "upstream_completion_tokens", "wasted_completion_tokens", "vram_peak_mib")  # fmt: skip
    missing: dict[str, Any] = dict.fromkeys(nones)
    return PolicyResult(policy="proxy/dev-1", **fields, **missing, upstream_series=series)


def test_failover_and_failures_are_read_from_the_records() -> None:
    router, local = "http://router", "http://local"
    r = result([(100.0, router, "ok", 50), (101.2, local, "ok", 40), (103.0, local, "ok", 40),
                (104.5, router, "ok", 30), (100.9, None, "upstream_error", 300)])  # fmt: skip
    (note,) = failover_times([r], killed=101.0, back=104.0, local=local, router=router)
    assert "fallback 200 ms after the kill" in note and "again 500 ms after it was back" in note
    assert "2 answers from the fallback" in note
    (failed,) = failures([r], {"replay start": 100.0, "router killed": 101.0, "router back": 104.0})
    assert failed == "proxy/dev-1: failed completion at +900 ms, in flight when router killed"
    assert failures([result([])], {"replay start": 0.0}) == ["no failed completions"]
