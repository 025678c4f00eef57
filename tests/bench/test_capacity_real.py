"""`benchmarks capacity`: a real team on a real scheduler, judged by the lab's rule, beside the lab's answer."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks.cli import main
from benchmarks.runners.capacity_real import measure
from mellum_proxy.tuning.reporting.capacity_report import CapacityReport, render
from mellum_proxy.tuning.runners.capacity import P95_LIMIT_MS, judge
from mellum_proxy.tuning.runners.policy import parse_policy
from mellum_proxy.tuning.runners.replay import run_developers
from tests.bench.bursts import burst_trace


def test_the_rule_pools_every_developers_pauses_and_holds_coverage_to_theirs_alone() -> None:
    quick, slow = [100.0] * 19, [100.0] * 18 + [P95_LIMIT_MS * 2] * 2
    assert judge([quick, quick], [1.0, 0.9], [1.0, 1.0])["carried"]
    assert not judge([quick, slow], [1.0, 1.0], [1.0, 1.0])["carried"]  # one developer's tail is the team's
    assert not judge([quick, quick], [0.8, 0.8], [1.0, 1.0])["carried"]  # under 90 % of what they get alone
    assert not judge([[], []], [0.0, 0.0], [0.0, 0.0])["carried"]  # nothing shown: no p95, not carried


@pytest.mark.slow  # seconds of real time
async def test_developers_staggered_each_type_their_whole_trace(sim_url: str) -> None:
    events = burst_trace()
    results = await run_developers(parse_policy("direct"), [events, events], sim_url, max_tokens=4, stagger_ms=300)
    assert [r.upstream_requests for r in results] == [24, 24]  # every keystroke of each, the later one too
    assert all(r.pause_coverage == 1.0 for r in results)


@pytest.mark.slow  # seconds of real time
async def test_the_team_grows_until_a_count_is_not_carried_and_the_report_sets_the_lab_beside_it(
    sim_url: str,
) -> None:
    seen: list[str] = []
    real = await measure([burst_trace()], sim_url, [parse_policy("direct")], [1, 2], 4, progress=seen.append)
    assert [line.split(":")[0] for line in seen] == ["real direct, 1 at once", "real direct, 2 at once"]
    assert [p["developers"] for p in real["capacity_curve"]] == [1, 2]
    assert [p["upstream_requests"] for p in real["capacity_curve"]] == [24, 48]  # the plugin's, every developer
    assert real["capacity"] == [{"policy": "direct", "developers": 2, "p95_ms": real["capacity_curve"][1]["p95_ms"],
                                 "coverage": 1.0}]  # fmt: skip
    lab_curve = [{"policy": "direct", "developers": 1, "p95_ms": 50.0, "coverage": 1.0, "upstream_requests": 24,
                  "carried": True}]  # fmt: skip
    result: CapacityReport = {"upstream": "sim", **real, "lab_capacity": [{"policy": "direct", "developers": 1}],
              "lab_curve": lab_curve, "profile": "fast", "traces": ["bursts"], "edits": 24}  # fmt: skip
    table = render(result, "python -m benchmarks capacity bursts")
    assert "| direct | 2 | 1 |" in table  # carried: real, lab
    assert "| direct | 1 |" in table and "| 50 | 100% | 100% | 24 | 24 | yes | yes |" in table
    assert "| direct | 2 |" in table and "| - | 100% | - | 48 | - | yes | - |" in table  # the lab did not try 2


@pytest.mark.parametrize("argv", [["--developers", "0"], ["--developers", "two"], ["--profile", "nowhere"]])
def test_bad_input_is_one_line(argv: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    trace = Path(__file__).parents[2] / "mellum_proxy/tuning/traces/json-crdt-blog-post.json.gz"
    with pytest.raises(SystemExit) as stopped:
        main(["capacity", str(trace), "--out", str(tmp_path), *argv])
    assert stopped.value.code == 2 and capsys.readouterr().err.count("\n") == 1
