"""`doctor` knows the server was never reached: it names the address, not quantization."""

from __future__ import annotations

from typing import Any

from mellum_proxy.http import RECORDS
from mellum_proxy.planner.doctor import diagnose
from tests.conftest import ProxyFactory


async def test_refused_requests_point_at_the_address(make_proxy: ProxyFactory, unused_tcp_port: int) -> None:
    proxy = await make_proxy(upstream=f"http://127.0.0.1:{unused_tcp_port}", tokenizer="chars", reuse=False)
    for i in range(4):
        resp = await proxy.post("/v1/completions", json={"prompt": f"def f{i}("})
        assert resp.status == 502
    records = [{"outcome": r.outcome, "error": r.error, "reached_upstream": r.reached_upstream}
               for r in proxy.app[RECORDS]]  # fmt: skip
    assert {r["error"] for r in records} == {"upstream_unreachable"}
    verdict = diagnose(records)
    assert verdict["verdict"] == "the server was never reached" and "--upstream" in verdict["knob"]
    assert "quantization" not in str(verdict)


def test_a_server_that_answered_errors_is_still_judged_by_its_failures() -> None:
    failed: list[dict[str, Any]] = [
        {"outcome": "upstream_error", "error": "server_error", "reached_upstream": True}
    ] * 5
    assert diagnose(failed)["verdict"] == "fails at load (or the server is down)"


def test_first_completions_after_breaks_that_time_out_point_at_the_servers_sleep() -> None:
    """A server that unloads its model when idle: what times out is what waited for its wake."""
    typing = [{"outcome": "ok", "reached_upstream": True, "ttft_ms": 60.0}] * 40
    after_breaks = [{"outcome": "timeout", "reached_upstream": False, "wake_ms": 1400.0}] * 5
    verdict = diagnose(typing + after_breaks)
    assert verdict["verdict"].startswith("the first completions after a break fail while the server wakes")
    assert "--sleep-idle-seconds" in verdict["knob"] and "5 of the 5" in verdict["evidence"][-1]
    slow = [{"outcome": "timeout", "reached_upstream": True, "ttft_ms": None}] * 5  # no wake: another verdict
    assert "wakes" not in diagnose(typing + slow)["verdict"]
