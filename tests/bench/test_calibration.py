"""`benchmarks calibrate`: real replays, taking turns, held to their median; the lab beside them."""

from __future__ import annotations

import pytest

from benchmarks.reporting.calibration_report import render
from benchmarks.runners.calibration import POLICIES, measure
from mellum_proxy.tuning.runners.lab import ORACLE
from mellum_proxy.tuning.sim.server import PROFILES
from mellum_proxy.tuning.sim.server_profile import ServerProfile
from tests.bench.bursts import burst_trace

pytestmark = pytest.mark.slow  # seconds of real time: in `make test`, not in `make test-fast`


async def test_the_lab_is_held_to_the_median_of_the_real_runs(sim_url: str) -> None:
    seen: list[str] = []
    result = await measure(burst_trace(), "bursts", sim_url, "sim", max_tokens=4, accuracy=0.0,
                           progress=seen.append, spec=PROFILES["fast"], runs=3)  # fmt: skip
    assert [line.split(":")[0] for line in seen] == [
        "real direct (1/3)",
        "real defaults (1/3)",
        "real direct (2/3)",
        "real defaults (2/3)",
        "real direct (3/3)",
        "real defaults (3/3)",
    ]  # fmt: skip (the policies take turns)
    direct = result["rows"][0]
    assert len(direct["runs"]) == 3 and direct["real"]["upstream_requests"] == 24  # the plugin's, every run
    assert direct["sim"]["upstream_requests"] == 24
    table = render(result, "python -m benchmarks calibrate bursts --runs 3")
    assert "| real: median of 3 | real range | sim: median of 3 | sim range |" in table
    assert "| direct | upstream requests | 24 | 24-24 | 24 | 24-24 | yes |" in table
    assert len(direct["sim_runs"]) == 3  # the lab run as often as the real server, each its own seed
    real_speed, lab_speed = direct["real"]["decode_ms_per_token"], direct["sim"]["decode_ms_per_token"]
    assert real_speed and lab_speed  # the sim server's `/metrics` counts decode time as llama.cpp's does
    assert f"| direct | server decode ms a token | {real_speed:.2f} |" in table  # shown beside, not held


async def test_measured_before_each_turn_the_lab_runs_each_turn_on_its_own_profile(sim_url: str) -> None:
    """With `--profile measure` the server is profiled before every turn, and lab run i is on turn i's profile:
    one profile taken at a slow moment no longer moves every lab run."""
    import dataclasses

    slow = dataclasses.replace(PROFILES["fast"], decode_tps=PROFILES["fast"].decode_tps / 4, idle_slowdown=1.5)
    profiles = iter([PROFILES["fast"], slow])
    seen: list[str] = []

    async def profile_turn() -> ServerProfile:
        seen.append("profiled")
        return next(profiles)

    result = await measure(burst_trace(), "bursts", sim_url, "sim", max_tokens=4, accuracy=0.0,
                           progress=seen.append, runs=2, profile_turn=profile_turn)  # fmt: skip
    assert [line.split(" (")[0] for line in seen] == ["profiled", "real direct", "real defaults"] * 2
    assert [turn["idle_slowdown"] for turn in result["turn_profiles"]] == [1.0, 1.5]
    fast, slowed = (run["latency_p95_ms"] for run in result["rows"][0]["sim_runs"])
    assert fast is not None and slowed is not None and slowed > 2 * fast  # run 2 on the slow profile
    assert "2 profiles: idle slowdown 1.00-1.50x" in render(result, "python -m benchmarks calibrate bursts")


async def test_a_turn_that_cannot_be_profiled_keeps_the_turns_run_and_takes_the_profile_before(sim_url: str) -> None:
    from mellum_proxy.planning.profile import ProfileError

    calls: list[int] = []

    async def profile_turn() -> ServerProfile:
        calls.append(1)
        if len(calls) == 2:
            raise ProfileError("the server answered 503")
        return PROFILES["fast"]

    seen: list[str] = []
    result = await measure(burst_trace(), "bursts", sim_url, "sim", max_tokens=4, accuracy=0.0,
                           progress=seen.append, runs=2, profile_turn=profile_turn)  # fmt: skip
    assert any(line.startswith("turn 2 could not be profiled (the server answered 503)") for line in seen)
    assert len(result["rows"][0]["runs"]) == 2 and len(result["turn_profiles"]) == 2  # nothing run is lost


async def test_with_the_oracle_it_takes_its_turn_after_the_defaults_and_sends_one_request_a_pause(sim_url: str) -> None:
    seen: list[str] = []
    result = await measure(burst_trace(), "bursts", sim_url, "sim", max_tokens=4, accuracy=0.0, progress=seen.append,
                           spec=PROFILES["fast"], runs=1, policies=(*POLICIES, ORACLE))  # fmt: skip
    assert [line.split(":")[0] for line in seen] == ["real direct (1/1)", "real defaults (1/1)", "real oracle (1/1)"]
    oracle = result["rows"][2]
    assert oracle["policy"] == "oracle"
    sent = oracle["real"]["upstream_requests"]
    assert sent is not None and 0 < sent < 24 and oracle["sim"]["upstream_requests"] == sent  # one a pause
    assert "| oracle | upstream requests |" in render(result, "python -m benchmarks calibrate bursts --oracle")
