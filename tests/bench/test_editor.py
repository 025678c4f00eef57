"""The editor model's accounting on hand-made timelines, and policies compared on the simulator."""

from __future__ import annotations

import asyncio
import logging
import sys
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from mellum_proxy.tuning.runners.playback import schedule
from mellum_proxy.tuning.runners.policy import parse_policy
from mellum_proxy.tuning.runners.replay import run_policy
from mellum_proxy.tuning.sim.server import PROFILES, SimServer
from mellum_proxy.tuning.workloads.editor import EditMark, RequestResult, account
from mellum_proxy.tuning.workloads.trace import Edit, Event, Open
from tests.bench.bursts import burst_trace


def marks(*times: float, file: str = "a") -> list[EditMark]:
    return [EditMark(i, file, t) for i, t in enumerate(times)]


def test_shown_only_before_the_next_edit_and_when_not_empty() -> None:
    edits = marks(0, 100, 1000)  # a pause after edit 1 (900 ms) and after the last edit
    results = [
        RequestResult(0, "a", 0, done_ms=150, text="late"),  # arrives after edit 1: not shown
        RequestResult(1, "a", 100, done_ms=400, text="x = 1"),  # shown, 300 ms into the pause
        RequestResult(2, "a", 1000, done_ms=1100, text=""),  # empty: not shown
    ]
    acct = account(edits, results, pause_ms=300)
    assert (acct.shown, acct.pauses, acct.covered) == (1, 2, 1)
    assert acct.pause_coverage == 0.5 and acct.latencies_ms == [300]


def test_after_the_last_edit_a_suggestion_counts_only_within_the_last_look() -> None:
    edits = marks(0, 1000)
    slow = [RequestResult(1, "a", 1000, done_ms=1000 + 90_000, text="y")]  # a backlog's answer, 90 s later
    assert account(edits, slow, pause_ms=300).covered == 1  # without a limit it counted, at 90 s
    late = account(edits, slow, pause_ms=300, last_look_ms=2000)
    assert (late.shown, late.pauses, late.covered) == (0, 2, 0)
    in_time = account(edits, [RequestResult(1, "a", 1000, done_ms=2500, text="y")], pause_ms=300, last_look_ms=2000)
    assert (in_time.covered, in_time.latencies_ms) == (1, [1500])


def test_cancelled_and_failed_requests_are_not_shown() -> None:
    edits = marks(0, 1000)
    results = [RequestResult(0, "a", 0, done_ms=50, text="x", cancelled=True), RequestResult(1, "a", 1000)]
    acct = account(edits, results, pause_ms=300)
    assert (acct.shown, acct.pauses, acct.covered) == (0, 2, 0)


def test_edits_of_another_file_do_not_hide_a_completion() -> None:
    edits = [EditMark(0, "a", 0), EditMark(1, "b", 50), EditMark(2, "a", 500)]
    acct = account(edits, [RequestResult(0, "a", 0, done_ms=100, text="y")], pause_ms=300)
    assert acct.shown == 1  # b's edit came first, but a's next edit only at 500 ms


def test_schedule_shortens_long_gaps_only() -> None:
    events: list[Event] = [Open(0, "a", ""), Edit(100, "a", 0, 0, "x"), Edit(60_000, "a", 1, 0, "y"),
                           Edit(60_200, "a", 2, 0, "z")]  # fmt: skip
    assert schedule(events, max_gap_ms=2000) == [0, 100, 2100, 2300]


def test_policy_strings() -> None:
    assert parse_policy("direct").settings is None
    assert parse_policy("direct-nocancel:plugin_cancel=false").plugin_cancel is False
    assert parse_policy("p:debounce_ms=100,max_inflight=2").settings == {"debounce_ms": "100", "max_inflight": "2"}
    with pytest.raises(ValueError, match="unknown proxy setting"):
        parse_policy("p:debounce=100")
    with pytest.raises(ValueError, match="key=value"):
        parse_policy("p:debounce_ms")


@pytest.mark.slow
async def test_debounce_sends_fewer_requests_than_direct_on_the_simulator(sim_url: str) -> None:
    events = burst_trace()
    direct = await run_policy(parse_policy("direct"), events, sim_url, pause_ms=300)
    debounced = await run_policy(
        parse_policy("debounce:debounce_ms=150,tokenizer=chars"), events, sim_url, pause_ms=300
    )
    assert direct.edits == debounced.edits == 24
    assert direct.upstream_requests == 24
    assert debounced.upstream_requests <= 6  # about one per burst
    assert debounced.pauses == direct.pauses == 3
    assert debounced.pause_coverage == 1.0  # the request at each pause start survives the debounce
    assert direct.upstream_completion_tokens is not None and debounced.upstream_completion_tokens is not None
    assert debounced.upstream_completion_tokens < direct.upstream_completion_tokens


async def test_sim_refuses_a_prompt_over_a_slots_context_and_queues_the_rest(aiohttp_client: Any) -> None:
    from dataclasses import replace

    from mellum_proxy.tuning.sim.server import PROFILES, SimServer

    sim = SimServer(replace(PROFILES["fast"], kv_tokens=200, slots=2))  # 100 tokens a slot
    client = await aiohttp_client(sim.app())
    resp = await client.post("/v1/completions", json={"prompt": "x" * 400, "max_tokens": 8})
    error = (await resp.json())["error"]
    assert resp.status == 400 and error["type"] == "exceed_context_size_error"  # llama.cpp's answer
    assert (error["n_prompt_tokens"], error["n_ctx"]) == (122, 100)
    many = [client.post("/v1/completions", json={"prompt": "x" * 300, "max_tokens": 8}) for _ in range(8)]
    answers = await asyncio.gather(*many)  # 8 x 91 tokens: far over the whole cache, yet queued, as llama.cpp does
    assert [r.status for r in answers] == [200] * 8


async def test_report_files(tmp_path: Path, sim_url: str) -> None:
    from mellum_proxy.tuning.reporting.replay_report import write

    result = await run_policy(parse_policy("direct"), burst_trace()[:5], sim_url)
    paths = write([result], tmp_path, "mellum-proxy bench replay t --upstream sim", ["note"])
    assert {p.name for p in paths} == {"results.json", "report.md", "latency_cdf.png", "inflight.png"}
    report = (tmp_path / "report.md").read_text()
    assert report.startswith("`mellum-proxy bench replay t --upstream sim`") and "| direct |" in report


async def test_reports_of_separate_runs_merge(tmp_path: Path, sim_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    from mellum_proxy.cli import main
    from mellum_proxy.tuning.reporting.replay_report import load, write

    first = await run_policy(parse_policy("direct"), burst_trace()[:5], sim_url)
    second = await run_policy(parse_policy("proxied:debounce_ms=0,tokenizer=chars"), burst_trace()[:5], sim_url)
    write([first], tmp_path / "a", "run a", [])
    write([second], tmp_path / "b", "run b", [])
    main(["bench", "report", str(tmp_path / "a" / "results.json"), str(tmp_path / "b" / "results.json"),
          "--out", str(tmp_path / "merged")])  # fmt: skip
    merged, data = load(tmp_path / "merged" / "results.json")
    assert [r.policy for r in merged] == ["direct", "proxied"]
    assert merged[1].upstream_requests == second.upstream_requests
    assert any("from `run a`" in note for note in data["notes"])


@pytest.mark.slow
async def test_every_replay_reads_its_policies_against_the_oracle(tmp_path: Path, sim_url: str) -> None:
    from mellum_proxy.cli import main
    from mellum_proxy.tuning.reporting.replay_report import load
    from mellum_proxy.tuning.workloads.trace import Trace, write_trace

    write_trace(Trace(burst_trace()), tmp_path / "bursts.jsonl")  # three bursts of eight keystrokes, three pauses
    argv = ["bench", "replay", str(tmp_path / "bursts.jsonl"), "--upstream", sim_url, "--policy", "direct",
            "--max-tokens", "4", "--out", str(tmp_path / "out")]  # fmt: skip
    await asyncio.to_thread(main, argv)
    results, _ = load(tmp_path / "out" / "results.json")
    assert [r.policy for r in results] == ["direct", "oracle"]  # added without being asked for
    assert results[0].upstream_requests == 24 and results[1].upstream_requests == 3
    report = (tmp_path / "out" / "report.md").read_text()
    assert "| requests / oracle | p95 / oracle |" in report and "| 8.00 |" in report and "| 1.00 | 1.00 |" in report


@pytest.mark.slow
async def test_the_server_counters_are_read_once_it_has_finished(aiohttp_server: Any) -> None:
    """The plugin has given up on its requests; the server still works through the prefills it began (they
    cannot be interrupted): the waste is read after them, and how long that took is reported."""
    from dataclasses import replace

    from mellum_proxy.tuning.sim.server import PROFILES, SimServer
    from mellum_proxy.tuning.workloads.trace import Edit, Open

    slow = SimServer(replace(PROFILES["fast"], prefill_tps=400, slots=2))
    url = str((await aiohttp_server(slow.app())).make_url("")).rstrip("/")
    long_file = "".join(f"value_{i} = compute({i})\n" for i in range(100))  # 2 s or so to prefill
    events: list[Event] = [
        Open(0, "short.py", "x = "),
        Open(0, "long.py", long_file),  # the warm-up caches short.py only
        Edit(50, "long.py", len(long_file), 0, "x"),  # abandoned at the next edit, mid-prefill
        Edit(100, "short.py", 4, 0, "1"),
    ]  # answered while the other still prefills
    result = await run_policy(parse_policy("direct"), events, url, max_tokens=8)
    assert slow.engine.active == 0 and slow.engine.deferred == 0  # nothing left running when it was read
    assert result.drain_s is not None and result.drain_s > 0.1


async def test_the_simulated_server_lets_a_client_go_without_a_traceback(caplog: pytest.LogCaptureFixture) -> None:
    """A client that leaves mid-answer (the proxy cancelling a superseded request) is the normal case: the server
    stops decoding for it and logs nothing (it printed `ClientConnectionResetError` tracebacks in a replay)."""
    sim = SimServer(PROFILES["embedded-cpu"])
    runner = web.AppRunner(sim.app())  # aiohttp's defaults: a handler is not cancelled when its client leaves
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    url = site.name.rstrip("/")
    body = {"prompt": "x" * 400, "max_tokens": 64, "stream": True}
    try:
        async with aiohttp.ClientSession() as session:
            for _ in range(3):
                async with session.post(url + "/v1/completions", json=body) as resp:
                    await resp.content.readany()  # the first event, then away
        await asyncio.wait_for(sim.engine.idle(), 10)  # each one left when its next write found the client gone
        async with aiohttp.ClientSession() as session, session.post(url + "/v1/completions", json=body) as resp:
            assert resp.status == 200 and (await resp.read()).endswith(b"[DONE]\n\n")  # it still serves
    finally:
        await runner.cleanup()
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR] == []


def test_a_report_says_the_command_as_it_was_typed(monkeypatch: pytest.MonkeyPatch) -> None:
    from mellum_proxy.tuning.reporting.writing import command_line

    monkeypatch.setattr(sys, "argv", ["/venv/bin/mellum-proxy", "bench", "replay", "t.json", "--out", "d"])
    assert command_line() == "mellum-proxy bench replay t.json --out d"
    monkeypatch.setattr(sys, "argv", ["/repo/benchmarks/__main__.py", "breaks", "--out", "d"])
    assert command_line() == "python -m benchmarks breaks --out d"  # the repository's measurements
