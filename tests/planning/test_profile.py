"""`mellum-proxy profile`: measured against the real embedded llama.cpp server, and read back by the lab."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest

from mellum_proxy.cli import main
from mellum_proxy.planning.cli import _speculating
from mellum_proxy.planning.profile import _fit, profile
from mellum_proxy.tuning.sim.server import profile as sim_profile


@pytest.mark.embedded
async def test_the_embedded_server_measured(embedded_server: Any, tmp_path: Path) -> None:
    lines: list[str] = []
    measured = await profile(embedded_server.url, "embedded", lines.append)
    assert measured.kind == "llama.cpp" and measured.slots == 2  # from its /props
    assert measured.prefill_tps > 0 and measured.decode_tps > 0 and measured.chars_per_token > 1
    assert [row["prompt_tokens"] for row in measured.ttft] == sorted(row["prompt_tokens"] for row in measured.ttft)
    assert all(row["cached_ms"] < row["cold_ms"] for row in measured.ttft[1:])  # the prompt cache, past the shortest
    assert [row["at_once"] for row in measured.concurrency] == [1, 2]
    assert measured.disconnect_stops_decode is True  # llama.cpp stops a streamed task at its next token
    # Whether it finished the prefill depends on when the disconnect landed (before the task started, between
    # its batches): measured as True on two busy cores once, False on an idle one. Reported, not asserted.
    assert measured.disconnect_stops_prefill in (True, False)
    # a plugin's request, again and again and each after a keystroke's quiet: at least five of each on this slow
    # server, the slowdown after the quiet (at least 1: a server is never taken as faster for having rested)
    assert len(measured.repeat_ms) >= 5 and len(measured.spaced_ms) >= 5
    assert measured.idle_slowdown >= 1.0 and measured.spread >= 0.0 and measured.overhead_per_token_ms >= 0.0
    assert measured.draft_acceptance is None  # the suite's server does not speculate
    path = tmp_path / "profile.json"
    path.write_bytes(measured.as_json())
    spec = sim_profile(str(path))  # what `bench lab --profile FILE.json` takes
    assert (spec.prefill_tps, spec.decode_tps, spec.slots) == (measured.prefill_tps, measured.decode_tps, 2)
    assert (spec.spread, spec.idle_slowdown) == (measured.spread, measured.idle_slowdown)
    assert spec.source.startswith("measured by `mellum-proxy profile")


def test_the_prefill_rate_is_the_slope_of_the_cold_times() -> None:
    intercept, slope = _fit([(100.0, 0.3), (500.0, 1.1), (1000.0, 2.1)])  # 2 ms a token, 100 ms before it
    assert slope == pytest.approx(0.002) and intercept == pytest.approx(0.1)


def test_an_unreachable_server_is_one_line_and_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as stopped:
        main(["profile", "--upstream", "http://127.0.0.1:9", "--out", str(tmp_path / "p.json")])
    assert stopped.value.code == 2
    assert "does not serve (connection refused" in capsys.readouterr().err.strip().splitlines()[-1]
    assert not (tmp_path / "p.json").exists()


def test_a_file_that_is_not_a_profile_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "other.json"
    path.write_bytes(orjson.dumps({"cells": []}))
    with pytest.raises(ValueError, match="not a profile"):
        sim_profile(str(path))


def test_a_few_requests_caught_in_a_slow_moment_do_not_make_the_spread() -> None:
    """The spread is read from the upper quartile: three requests of 26 slowed 4x by the machine move it by the
    share of the requests they are, not by how slow they were (the standard deviation tripled)."""
    import math

    from mellum_proxy.planning.profile import spread

    steady = [100 * math.exp(0.1 * z) for z in (-1.5, -1.0, -0.5, 0.0, 0.5, 1.0, 1.5)] * 3 + [100.0, 100.0]
    caught = steady + [400.0] * 3
    assert spread(steady) < spread(caught) < 1.5 * spread(steady)
    assert 0.05 < spread(steady) < 0.15


def test_the_spread_follows_the_slow_side_of_the_median() -> None:
    """Times skewed towards the slow side, as this machine's are: the spread is what the slow side says, which a
    p95 sees, not the fast side's narrow one (the median absolute deviation, both sides, read 0.07 here)."""
    import math

    from mellum_proxy.planning.profile import spread

    fast_side = [100 * math.exp(-0.05 * k / 5) for k in range(1, 6)]  # within 5 % below the median
    slow_side = [100 * math.exp(0.3 * k / 5) for k in range(1, 6)]  # up to 35 % above it
    times = [*fast_side, 100.0, *slow_side]
    upper_quartile = (0.3 * 2 / 5 + 0.3 * 3 / 5) / 2  # of the logarithms: between the 8th and 9th of 11
    assert spread(times) == pytest.approx(upper_quartile / 0.6745)


@pytest.mark.embedded
async def test_the_embedded_servers_decode_with_speculation_is_measured_beside() -> None:
    """`profile --upstream embedded` starts the server again with `ngram-mod` and reads its decode rate and what
    it drafted from its own timings; a server without speculation says nothing drafted."""
    said = await _speculating(None)
    assert said["spec"] == "ngram-mod" and said["decode_tps"] and said["decode_tps"] > 0
    assert said["drafted"] > 0 and 0 <= said["draft_acceptance"] <= 1
