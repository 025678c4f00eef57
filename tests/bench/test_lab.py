"""The simulated server keeps llama.cpp's scheduling, and the lab replays a trace through the real
service in virtual time."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from pathlib import Path

from mellum_proxy.tuning.reporting.lab_report import pareto
from mellum_proxy.tuning.runners.lab import run_lab
from mellum_proxy.tuning.runners.policy import Policy
from mellum_proxy.tuning.sim.engine import SimEngine
from mellum_proxy.tuning.sim.server import PROFILES
from mellum_proxy.tuning.workloads.synth import synthesize
from mellum_proxy.tuning.workloads.trace import Edit, Event, Open, next_typed
from tests.virtual_time import run_virtual

SLOW = replace(PROFILES["embedded-cpu"], slots=1, overhead_ms=0, batch_penalty=0)
SYNTH_SOURCE_DIR = Path(__file__).parents[2] / "mellum_proxy" / "tuning" / "code"


def test_prefill_is_not_interrupted_and_decode_stops_at_the_next_token() -> None:
    async def run() -> None:
        engine = SimEngine(SLOW)
        task = engine.submit("x" * 330, 16, "abcdefghijklmnop")  # 100 tokens: 0.29 s of prefill
        await asyncio.sleep(0.1)
        task.leave()
        await asyncio.sleep(0.15)
        assert engine.held == 1  # still prefilling
        await engine.idle()
        assert task.completion_tokens == 0 and engine.prompt_tokens == 100

    run_virtual(run())


def test_a_queued_task_whose_client_left_stays_held_until_it_would_start() -> None:
    async def run() -> None:
        engine = SimEngine(SLOW)
        first = engine.submit("x" * 330, 4, "abcd")
        queued = engine.submit("y" * 330, 4, "abcd")
        queued.leave()
        await asyncio.sleep(0.1)
        assert engine.held == 2
        await engine.idle()
        assert queued.dropped and not first.dropped and engine.peak_held == 2

    run_virtual(run())


def test_a_short_non_streamed_task_runs_to_its_end_without_its_client() -> None:
    async def run() -> None:
        engine = SimEngine(SLOW)
        task = engine.submit("x" * 33, 4, "abcdefghijkl", stream=False)
        task.leave()
        await engine.idle()
        assert task.completion_tokens == 4

    run_virtual(run())


def test_an_abandoned_non_streamed_task_is_cancelled_after_a_second_in_which_no_result_came() -> None:
    """llama.cpp's handler of a non-streamed request looks at its connection only when a second passes with no
    result from the server (`HTTP_POLLING_SECONDS`): a task running alone is stopped then."""

    async def run() -> None:
        engine = SimEngine(SLOW)  # 60 tokens/s: 300 tokens would take 5 s
        loop = asyncio.get_running_loop()
        task = engine.submit("x" * 33, 300, "ab" * 2000, stream=False)
        await asyncio.sleep(0.3)
        task.leave()
        await engine.idle()
        assert task.cancelled and task.finish_reason == "cancelled"
        assert 1.0 <= loop.time() < 1.0 + 2 / SLOW.decode_tps  # stopped at the first token after the silent second
        assert 50 <= task.completion_tokens <= 60

    run_virtual(run())


def test_results_to_another_request_keep_an_abandoned_non_streamed_task_running() -> None:
    """Every streamed token wakes the waiting handler, which then never has a silent second to look in."""

    async def run() -> None:
        engine = SimEngine(replace(SLOW, slots=2))
        streamed = engine.submit("y" * 33, 200, "cd" * 2000)
        abandoned = engine.submit("x" * 33, 100, "ab" * 2000, stream=False)
        await asyncio.sleep(0.3)
        abandoned.leave()
        await engine.idle()
        assert not abandoned.cancelled and abandoned.completion_tokens == 100
        assert streamed.completion_tokens == 200

    run_virtual(run())


def test_a_queued_non_streamed_task_whose_client_left_is_dropped_after_a_silent_second() -> None:
    async def run() -> None:
        engine = SimEngine(SLOW)
        loop = asyncio.get_running_loop()
        running = engine.submit("x" * 33, 120, "ab" * 2000, stream=False)  # 2 s, sending nothing until its end
        queued = engine.submit("y" * 33, 4, "cd", stream=False)
        queued.leave()
        await engine.changes.wait_for(lambda: engine.held == 1, timeout_s=5)
        assert queued.dropped and 1.0 <= loop.time() < 1.1 and not running.done
        await engine.idle()
        assert running.completion_tokens == 120 and queued.completion_tokens == 0

    run_virtual(run())


def test_prompt_cache_prefills_only_what_changed() -> None:
    async def run() -> None:
        engine = SimEngine(SLOW)
        await engine.submit("x" * 330, 1, "a").changes.wait_for(lambda: engine.held == 0)
        second = engine.submit("x" * 330 + "yyy", 1, "a")
        await engine.idle()
        assert second.cached_tokens == 100 and engine.prompt_tokens == 101

    run_virtual(run())


def test_next_typed_follows_typing_at_the_cursor() -> None:
    events: list[Event] = [Open(0, "a", ""), Edit(1, "a", 0, 0, "d"), Edit(2, "a", 1, 0, "ef"), Edit(3, "a", 0, 0, "X")]
    truth = next_typed(events)
    assert truth == {1: "ef", 2: "", 3: ""}  # the edit at offset 0 is not typing on at the cursor


def test_the_lab_replays_direct_and_the_defaults_and_reuse_saves_requests() -> None:
    trace = synthesize("def total(items):\n    return sum(item.price for item in items)\n" * 3, "a.py", seed=1)
    fast = PROFILES["fast"]
    direct = run_lab(Policy("direct", None), trace.events, fast, "t", accuracy=1.0)
    defaults = run_lab(Policy("defaults", {}), trace.events, fast, "t", accuracy=1.0)
    assert direct.upstream_requests == direct.edits == defaults.edits
    assert defaults.reused > 0 and defaults.upstream_requests + defaults.reused <= defaults.edits
    assert defaults.pause_coverage is not None and defaults.pause_coverage >= (direct.pause_coverage or 0) - 0.01
    assert (defaults.predicted_chars or 0) >= (direct.predicted_chars or 0)  # what the person typed next, shown
    assert defaults in pareto([direct, defaults])  # no other result beats it on requests, coverage and p95


def test_the_server_never_holds_more_than_max_concurrency_of_the_proxys_requests() -> None:
    """Server-true admission on the llama.cpp-like simulator, with a fast typist against a slow server:
    cancelled requests keep their slot until the server has let them go."""
    from mellum_proxy.tuning.workloads.synth import synthesize
    from mellum_proxy.tuning.workloads.trace import Trace, limited

    source = (SYNTH_SOURCE_DIR / "inventory.py").read_text()
    events = list(limited(Trace(synthesize(source, "inventory.py", seed=3, typist="fast").events), 300))
    spec = PROFILES["embedded-cpu"]
    direct = run_lab(Policy("direct", None), events, spec, "t")
    defaults = run_lab(Policy("defaults", {}), events, spec, "t")
    assert direct.peak_held > spec.slots  # without the proxy the server's own queue fills
    assert defaults.peak_held <= spec.slots


def test_a_prompt_over_a_slot_is_the_servers_400_not_a_proxy_defect() -> None:
    """The simulator's refusal (a prompt over a slot's context) reaches the service as llama.cpp's 400, which
    the proxy reads as a context overflow; it was a TypeError once, recorded `internal_error`."""
    from mellum_proxy.errors import UpstreamStatusError
    from mellum_proxy.models import BudgetedPrompt, NormalizedRequest
    from mellum_proxy.tuning.runners.lab_parts import EngineSource, Writer
    from mellum_proxy.upstream.servers import context_overflow

    async def run() -> None:
        engine = SimEngine(replace(SLOW, kv_tokens=10))
        source = EngineSource(engine, Writer({0: "x"}, 0.0), {"r": 0})
        request = NormalizedRequest(id="r", route="openai", session="s", prefix="x" * 400)
        prompt = BudgetedPrompt("x" * 400, None, 16, (), 120, 120, False, "chars")
        try:
            async for _ in source.stream_completion(request, prompt):
                raise AssertionError("a refused task streams nothing")
        except UpstreamStatusError as error:
            assert error.status == 400 and context_overflow(error) == 122  # the tokens it counted
        else:
            raise AssertionError("the refusal was swallowed")

    run_virtual(run())


def test_the_oracle_sends_one_request_per_pause_the_moment_typing_stops() -> None:
    from mellum_proxy.tuning.runners.lab import ORACLE
    from mellum_proxy.tuning.runners.playback import pause_starts
    from tests.bench.bursts import burst_trace

    events = burst_trace()  # three bursts of eight keystrokes, each followed by a pause
    starts = pause_starts(events, max_gap_ms=2000, pause_ms=300)
    assert starts == {8, 16, 24}  # the last keystroke of each burst
    oracle = run_lab(ORACLE, events, PROFILES["fast"], "bursts", accuracy=1.0)
    direct = run_lab(Policy("direct", None), events, PROFILES["fast"], "bursts", accuracy=1.0)
    assert oracle.upstream_requests == oracle.pauses == 3 and direct.upstream_requests == 24
    assert oracle.pause_coverage == 1.0  # a fast server answers every pause


def test_the_defaults_are_held_to_the_oracle_when_it_ran() -> None:
    from mellum_proxy.tuning.reporting.lab_report import meets_targets
    from mellum_proxy.tuning.reporting.results import LabResult

    def result(name: str, requests: int, p95: float, waste: int) -> LabResult:
        return LabResult(policy=name, trace="t", profile="p", accuracy=0.3, edits=100, pauses=10, pause_coverage=0.9,
                         latency_p50_ms=p95 / 2, latency_p95_ms=p95, upstream_requests=requests,
                         requests_per_edit=requests / 100, completion_tokens=0, wasted_completion_tokens=waste,
                         prompt_tokens_computed=0, predicted_chars=0, reused=0, timeouts=0, errors=0, peak_held=1,
                         settings=None)  # fmt: skip

    direct, oracle = result("direct", 100, 500.0, 400), result("oracle", 10, 200.0, 0)
    assert meets_targets(result("defaults", 15, 220.0, 100), direct, oracle) == {
        "coverage": True, "p95": True, "requests": True, "waste": True}  # fmt: skip
    missed = meets_targets(result("defaults", 16, 230.0, 101), direct, oracle)
    assert missed == {"coverage": True, "p95": False, "requests": False, "waste": False}
    assert meets_targets(result("defaults", 33, 230.0, 100), direct)["requests"]  # without an oracle: 1/3 of direct
    assert meets_targets(result("defaults", 15, 0.0, 100), direct, oracle)["p95"]  # every pause answered at once


def test_no_policy_without_prediction_sends_fewer_than_the_edits_followed_by_a_longer_gap() -> None:
    from mellum_proxy.tuning.reporting.lab_report import summarize
    from mellum_proxy.tuning.runners.lab import ORACLE
    from mellum_proxy.tuning.runners.playback import gaps_after
    from mellum_proxy.tuning.workloads.editor import no_prediction_floor
    from tests.bench.bursts import burst_trace

    events = burst_trace()  # three bursts of eight keystrokes 40 ms apart, each followed by a pause
    gaps = list(gaps_after(events, max_gap_ms=2000).values())
    assert no_prediction_floor(gaps, 0) == 24  # answering at once: a request for every edit
    assert no_prediction_floor(gaps, 100) == 3  # waiting 100 ms sees each burst through: one per pause
    runs = [run_lab(policy, events, PROFILES["fast"], "bursts", accuracy=0.0)
            for policy in (Policy("direct", None), ORACLE, Policy("defaults", {}))]  # fmt: skip
    summary = summarize(runs, [PROFILES["fast"]], 0.0, 16, 100, {"bursts": gaps})
    (row,) = summary["targets"]
    oracle = runs[1]
    assert row["limit"] == 4 and row["floor"] == no_prediction_floor(gaps, 0.1 * (oracle.latency_p95_ms or 0))
    assert row["floor"] > row["limit"] and not row["requests"]  # no policy could have met it at accuracy 0
    assert summary["bound"]["fast"][0][0] == 1.0  # a hold of 0 ms: one request per edit


def test_p95_is_compared_over_the_pauses_both_answered() -> None:
    from mellum_proxy.tuning.reporting.lab_report import meets_targets
    from mellum_proxy.tuning.reporting.results import LabResult

    def result(name: str, latencies: dict[int, float]) -> LabResult:
        return LabResult(policy=name, trace="t", profile="p", accuracy=0.0, edits=100, pauses=10,
                         pause_coverage=len(latencies) / 10, latency_p50_ms=None,
                         latency_p95_ms=max(latencies.values()), upstream_requests=10, requests_per_edit=0.1,
                         completion_tokens=0, wasted_completion_tokens=0, prompt_tokens_computed=0, reused=0,
                         timeouts=0, errors=0, peak_held=1, latencies_ms=list(latencies.values()),
                         covered_pauses=list(latencies))  # fmt: skip

    direct = result("direct", {3: 400.0})  # a server behind: direct answered one pause of ten
    defaults = result("defaults", {1: 900.0, 2: 800.0, 3: 300.0, 4: 700.0})
    assert meets_targets(defaults, direct)["p95"]  # on the pause direct answered, the defaults were sooner
    assert not meets_targets(result("defaults", {1: 100.0, 3: 450.0}), direct)["p95"]


def test_the_oracle_lets_go_of_a_suggestion_once_typing_resumes() -> None:
    from mellum_proxy.tuning.runners.lab import ORACLE
    from tests.bench.bursts import burst_trace

    slow = replace(PROFILES["fast"], name="slow-decode", decode_tps=10)  # 16 tokens take 1.6 s, pauses are 0.6 s
    oracle = run_lab(ORACLE, burst_trace(), slow, "bursts", accuracy=0.0)
    assert oracle.upstream_requests == 3 and oracle.pause_coverage == 1 / 3  # only the last pause waits long enough
    # the two it typed past were stopped at the next token once typing resumed (about 6 each), not decoded to 16
    assert oracle.completion_tokens < 16 + 2 * 8


def test_with_a_grid_each_target_says_how_many_policies_met_it() -> None:
    from mellum_proxy.tuning.reporting.lab_report import render, summarize
    from mellum_proxy.tuning.runners.lab import ORACLE
    from tests.bench.bursts import burst_trace

    events = burst_trace()
    policies = [Policy("direct", None), ORACLE, Policy("defaults", {}), Policy("fixed=300", {"debounce_ms": 300})]
    runs = [run_lab(policy, events, PROFILES["fast"], "bursts", accuracy=0.0) for policy in policies]
    (row,) = summarize(runs, [PROFILES["fast"]], 0.0, 16, 100)["targets"]
    assert row["policies"] == 2 and set(row["met_by"]) == {"coverage", "p95", "requests", "waste", "all"}
    assert row["met_by"]["requests"] >= row["requests"]  # the defaults are one of the two
    table = render(summarize(runs, [PROFILES["fast"]], 0.0, 16, 100), "bench lab")
    assert f"| {row['met_by']['all']}/2 |" in table
