"""The lab's developer counts: how many developers one server carries, with and without chat beside the typing."""

from __future__ import annotations

import subprocess
import sys

import pytest

from mellum_proxy.tuning.runners import capacity
from mellum_proxy.tuning.runners.policy import Policy
from mellum_proxy.tuning.sim.server import PROFILES
from mellum_proxy.tuning.workloads.synth import synthesize

SOURCE = "def total(items):\n    return sum(item.price for item in items)\n"


def test_capacity_finds_how_many_developers_a_slow_server_carries() -> None:
    trace = synthesize(SOURCE * 2, "a.py", seed=3).events
    policies = [Policy("direct", None), Policy("defaults", {})]
    result = capacity.measure([trace], [PROFILES["embedded-cpu"]], policies, [1, 2, 4], accuracy=0.0,
                              max_gap_ms=2000, max_tokens=16, progress=lambda _: None)  # fmt: skip
    carried = {row["policy"]: row["developers"] for row in result["capacity"]}
    assert carried["defaults"] >= carried["direct"] and carried["defaults"] >= 1
    tried = [p["developers"] for p in result["capacity_curve"] if p["policy"] == "direct"]
    assert tried == sorted(tried) and tried[0] == 1


@pytest.mark.slow  # seconds of real time
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
