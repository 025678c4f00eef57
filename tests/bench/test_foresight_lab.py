"""Foresight in the lab: the policy itself (not the defaults under its name), its yardsticks, and how many
developers one server carries."""

from __future__ import annotations

import subprocess
import sys

import pytest

from benchmarks.runners import pauses
from mellum_proxy.policies.pause_model import MIN_PAUSES, Prior
from mellum_proxy.tuning.reporting.lab_report import foresight_against_defaults
from mellum_proxy.tuning.runners import capacity
from mellum_proxy.tuning.runners.lab import ORACLE, run_lab
from mellum_proxy.tuning.runners.policy import Policy, parse_policy
from mellum_proxy.tuning.sim.server import PROFILES
from mellum_proxy.tuning.workloads.synth import synthesize
from mellum_proxy.tuning.workloads.trace import Edit, Event, Open

SOURCE = "def total(items):\n    return sum(item.price for item in items)\n"


def rhythm_trace(words: int = 3 * MIN_PAUSES) -> list[Event]:
    """A typist with a rhythm the model can learn: a word at 100 ms a letter, then a 600 ms pause after its space."""
    events: list[Event] = [Open(0, "notes.py", "")]
    t, offset = 0, 0
    for _ in range(words):
        for char in "word ":
            t += 100
            events.append(Edit(t, "notes.py", offset, 0, char))
            offset += 1
        t += 600
    return events


def test_foresight_is_the_policy_itself() -> None:
    policy = parse_policy("foresight")
    assert policy.settings == {"dispatch": "foresight"}
    assert parse_policy("foresight:foresight_hold_ms=100").settings == {"dispatch": "foresight",
                                                                         "foresight_hold_ms": "100"}  # fmt: skip


def test_foresight_learns_a_rhythm_and_saves_what_the_defaults_send() -> None:
    events = rhythm_trace()
    fast = PROFILES["fast"]
    policies = (Policy("direct", None), ORACLE, Policy("defaults", {}), parse_policy("foresight"))
    runs = [run_lab(policy, events, fast, "rhythm", accuracy=0.0) for policy in policies]
    direct, oracle, defaults, foresight = runs
    assert foresight.settings == {"dispatch": "foresight"}
    assert foresight.upstream_requests < 0.7 * defaults.upstream_requests  # the letters of each word are held
    assert (foresight.pause_coverage or 0) >= (direct.pause_coverage or 0) - 0.01
    compared = foresight_against_defaults(runs, {})
    assert compared is not None and compared["rows"][0]["requests"] == foresight.upstream_requests
    assert compared["rows"][0]["coverage"] and compared["rows"][0]["p95"]
    assert oracle.upstream_requests == oracle.pauses


def test_the_pause_model_is_scored_on_traces_it_was_not_fitted_on() -> None:
    traces = [("rhythm", rhythm_trace()), ("synth", synthesize(SOURCE * 4, "a.py", seed=2).events)]
    result = pauses.measure(traces, limit_events=400, held_pauses=0.03)
    prior = Prior.from_json(result["prior"])  # what `--prior` writes loads back
    assert prior.about["traces"] == ["rhythm", "synth"]
    rows = {row["trace"]: row for row in result["leave_one_out"]}
    assert set(rows) == {"rhythm", "synth"}
    for row in rows.values():
        assert 0 <= row["online"]["recall"] <= 1 and row["no_foresight"]["recall"] == 1
    assert pauses.auc([0.1, 0.9, 0.2, 0.8], [0, 1, 0, 1]) == 1.0
    assert pauses.auc([0.5, 0.5], [0, 1]) == 0.5


def test_capacity_finds_how_many_developers_a_slow_server_carries() -> None:
    trace = synthesize(SOURCE * 2, "a.py", seed=3).events
    policies = [Policy("direct", None), Policy("defaults", {})]
    result = capacity.measure([trace], [PROFILES["embedded-cpu"]], policies, [1, 2, 4], accuracy=0.0,
                              max_gap_ms=2000, max_tokens=16, progress=lambda _: None)  # fmt: skip
    carried = {row["policy"]: row["developers"] for row in result["capacity"]}
    assert carried["defaults"] >= carried["direct"] and carried["defaults"] >= 1
    tried = [p["developers"] for p in result["capacity_curve"] if p["policy"] == "direct"]
    assert tried == sorted(tried) and tried[0] == 1


def test_capacity_with_chat_beside_the_typing_keeps_the_completions_lane() -> None:
    """Half the developers also chat, one long answer after another, on the same server: through the proxy the
    chats wait in its bulk lane and the typing keeps its reserve; direct, they hold the slots completions need."""
    trace = synthesize(SOURCE * 2, "a.py", seed=3).events
    policies = [Policy("direct", None), Policy("defaults", {})]
    result = capacity.measure([trace], [PROFILES["gpu"]], policies, [2], accuracy=0.0, max_gap_ms=2000,
                              max_tokens=16, progress=lambda _: None, chat_share=0.5)  # fmt: skip
    p95 = {p["policy"]: p["p95_ms"] for p in result["capacity_curve"]}
    assert result["capacity_rule"]["chat_share"] == 0.5
    assert p95["defaults"] is not None and p95["direct"] is not None and p95["defaults"] <= p95["direct"]


@pytest.mark.parametrize("bad", ["0", "two", ","])
def test_developers_must_be_counts(bad: str) -> None:
    with pytest.raises(ValueError, match="--developers"):
        capacity.parse_developers(bad)
    command = [sys.executable, "-m", "mellum_proxy", "bench", "lab", "--developers", bad, "--profile", "fast",
               "--limit-events", "5"]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "--developers" in done.stderr and "Traceback" not in done.stderr
