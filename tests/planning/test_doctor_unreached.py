"""`doctor` knows the server was never reached: it names the address, not quantization."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from mellum_proxy.http import RECORDS
from mellum_proxy.telemetry.doctor import diagnose
from mellum_proxy.telemetry.stats import read_log
from tests.conftest import ProxyFactory
from tests.sse import page_state


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


async def test_the_pages_explain_and_doctor_give_one_verdict(
    make_proxy: ProxyFactory, unused_tcp_port: int, tmp_path: Path
) -> None:
    """A dead upstream: the live page's Explain names what `doctor` names over the same requests' log."""
    log = tmp_path / "requests.jsonl"
    proxy = await make_proxy(upstream=f"http://127.0.0.1:{unused_tcp_port}", tokenizer="chars", reuse=False, log=log)
    for i in range(6):
        assert (await proxy.post("/v1/completions", json={"prompt": f"def f{i}("})).status == 502
    explained = await page_state(proxy, "explain")
    await proxy.close()  # the log is written through
    records, _ = read_log(log)
    said = diagnose(records)
    assert (explained["verdict"], explained["knob"]) == (said["verdict"], said["knob"])
    assert said["verdict"] == "the server was never reached"


def test_completions_that_time_out_while_decoding_point_at_speculation() -> None:
    """The first token in time, then the deadline during the decode: the knob is the decode speed."""
    typing = [{"outcome": "ok", "reached_upstream": True, "ttft_ms": 80.0}] * 30
    decoding = [{"outcome": "timeout", "reached_upstream": True, "ttft_ms": 120.0, "draft_n": 10,
                 "draft_n_accepted": 4}] * 5  # fmt: skip
    verdict = diagnose(typing + decoding)
    assert verdict["verdict"].startswith("completions time out while decoding")
    assert "fit --spec" in verdict["knob"] and "(20 of 50 drafted tokens accepted)" in verdict["evidence"][-1]
    before_first_token = [{"outcome": "timeout", "reached_upstream": True, "ttft_ms": None}] * 5
    assert "decoding" not in diagnose(typing + before_first_token)["verdict"]
