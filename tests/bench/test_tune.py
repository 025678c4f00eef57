"""`mellum-proxy tune`: the lab's grid over one person's typing on one server, written as a config `serve` takes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest

from mellum_proxy.cli import main
from mellum_proxy.settings_file import load_settings
from mellum_proxy.tuning.reporting.lab_report import plot
from mellum_proxy.tuning.reporting.tune_report import verdict
from mellum_proxy.tuning.runners.policy import Policy
from mellum_proxy.tuning.runners.tune import config_toml, read_typing, tune
from mellum_proxy.tuning.sim.server import PROFILES
from tests.bench.bursts import burst_trace

CANDIDATES = [Policy("defaults", {}), Policy("fixed=300", {"dispatch": "fixed", "debounce_ms": 300}),
              Policy("no-reuse", {"reuse": False})]  # fmt: skip


def test_the_choice_meets_the_targets_or_is_the_defaults(tmp_path: Path) -> None:
    lines: list[str] = []
    result = tune([("bursts", burst_trace())], PROFILES["embedded-cpu"], policies=CANDIDATES, progress=lines.append)
    assert len(lines) == 2  # one per accuracy
    assert {run["policy"] for run in result["runs"]} == {"direct", "oracle", "defaults", "fixed=300", "no-reuse"}
    assert {run["accuracy"] for run in result["runs"]} == {0.0, 0.3}
    chosen = result["chosen"]
    assert chosen in {"defaults", "fixed=300", "no-reuse"}
    assert chosen == "defaults" or all(result["targets"][chosen].values())
    path = tmp_path / "config.toml"
    path.write_text(config_toml(result["settings"]))
    settings = load_settings(config_file=path)  # what `serve --config` reads
    for key, value in result["settings"].items():
        assert getattr(settings, key) == value
    panels = result["frontier"]  # one frontier panel per accuracy, every candidate on it
    assert list(panels["profiles"]) == ["accuracy 0", "accuracy 0.3"]
    assert {m["policy"] for m in panels["means"]["accuracy 0"]} >= {"direct", "oracle", "no-reuse"}
    plot(panels, tmp_path / "frontier.png", highlight=chosen)
    assert (tmp_path / "frontier.png").stat().st_size > 10_000
    read_back = orjson.loads(orjson.dumps(panels))  # a policy that answered no pause: its NaN p95 is now null
    plot(read_back, tmp_path / "again.png", highlight=chosen)


def test_only_what_differs_from_the_defaults_is_written() -> None:
    text = config_toml({"dispatch": "fixed", "debounce_ms": 300, "reuse": True})
    assert 'dispatch = "fixed"' in text and "debounce_ms = 300" in text and "reuse" not in text


def test_stdout_says_what_the_report_concludes() -> None:
    """`tune` printed only `chosen: defaults`; tune.md alone said that no candidate met every target."""
    base: dict[str, Any] = {"profile": "p", "source": "s", "waived": [], "runs": [], "frontier": {}}
    none_met = verdict(
        {
            **base,
            "chosen": "defaults",
            "settings": {},
            "targets": {"defaults": {"coverage": True, "p95": False}, "x": {"coverage": False, "p95": True}},
        }
    )
    assert none_met == [
        "0 of 2 candidates met every target.",
        "The chosen defaults misses: p95 (tune.md has the figures).",
        "No setting differs from the defaults: the defaults stand (config.toml changes nothing).",
    ]
    one_met = verdict(
        {
            **base,
            "chosen": "x",
            "settings": {"reuse": False},
            "targets": {"defaults": {"p95": False}, "x": {"p95": True}},
        }
    )
    assert one_met == ["1 of 2 candidates met every target."]
    assert config_toml({}).rstrip().endswith("# none does: the defaults stand")


def test_a_recording_is_read_as_typing(tmp_path: Path) -> None:
    recording = tmp_path / "me.jsonl"
    recording.write_text('{"t": 0.0, "session": "s", "dialect": "openai", "file": "a.py", "prefix_chars": 3, '
                         '"suffix_chars": 0}\n{"t": 0.5, "session": "s", "dialect": "openai", "file": "a.py", '
                         '"prefix_chars": 4, "suffix_chars": 0}\n')  # fmt: skip
    assert read_typing(recording)


def test_an_unknown_profile_is_one_line_and_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as stopped:
        main(["tune", str(tmp_path / "none.jsonl"), "--profile", "nowhere", "--out", str(tmp_path)])
    assert stopped.value.code == 2 and "unknown sim profile" in capsys.readouterr().err


def test_a_candidate_that_meets_every_target_wins_over_defaults_that_do_not() -> None:
    from mellum_proxy.tuning.reporting.results import LabResult
    from mellum_proxy.tuning.runners.tune import choose

    def run(name: str, requests: int, p95: float, accuracy: float) -> LabResult:
        return LabResult(policy=name, trace="me", profile="p", accuracy=accuracy, edits=100, pauses=10,
                         pause_coverage=0.9, latency_p50_ms=p95 / 2, latency_p95_ms=p95, upstream_requests=requests,
                         requests_per_edit=requests / 100, completion_tokens=0, wasted_completion_tokens=0,
                         prompt_tokens_computed=0, predicted_chars=0, reused=0, timeouts=0, errors=0,
                         peak_held=1)  # fmt: skip

    runs = [r for a in (0.0, 0.3) for r in (run("direct", 100, 500.0, a), run("oracle", 10, 200.0, a),
                                            run("defaults", 12, 100.0, a) if a else run("defaults", 12, 600.0, a),
                                            run("held", 14, 210.0, a))]  # fmt: skip
    chosen, met, waived = choose(runs)
    assert not all(met["defaults"].values()) and all(met["held"].values())
    assert chosen == "held" and waived == []  # though the defaults' mean p95 (350 ms) is the lower


def test_a_target_no_policy_could_meet_at_accuracy_0_is_not_held_against_any() -> None:
    from mellum_proxy.tuning.reporting.results import LabResult
    from mellum_proxy.tuning.runners.tune import choose

    def run(name: str, requests: int, accuracy: float) -> LabResult:
        return LabResult(policy=name, trace="me", profile="p", accuracy=accuracy, edits=100, pauses=10,
                         pause_coverage=0.9, latency_p50_ms=100.0, latency_p95_ms=200.0, upstream_requests=requests,
                         requests_per_edit=requests / 100, completion_tokens=0, wasted_completion_tokens=0,
                         prompt_tokens_computed=0, predicted_chars=0, reused=0, timeouts=0, errors=0,
                         peak_held=1)  # fmt: skip

    runs = [run("direct", 100, 0.0), run("oracle", 10, 0.0), run("defaults", 90, 0.0),
            run("direct", 100, 0.3), run("oracle", 10, 0.3), run("defaults", 12, 0.3)]  # fmt: skip
    steady = [150.0] * 99 + [1e9]  # every gap longer than the allowance (20 ms): the floor is 100 requests
    chosen, met, waived = choose(runs, {"me": steady})
    assert waived == [("me", 0.0)] and met["defaults"]["requests"] and chosen == "defaults"
    _, met, waived = choose(runs, {"me": [1.0] * 99 + [1e9]})  # a burst a policy could have waited out
    assert waived == [] and not met["defaults"]["requests"]


def test_five_servers_plot_in_rows_with_the_legend_under_each_panel(tmp_path: Path) -> None:
    """Five panels in one row made a 3,300 x 495 strip with the legend over a curve's label."""
    result = tune([("bursts", burst_trace())], PROFILES["embedded-cpu"], policies=CANDIDATES[:1])
    panel = result["frontier"]
    five: dict[str, Any] = {
        key: {f"server {i}": next(iter(panel[key].values()), []) for i in range(5)} for key in panel
    }
    plot(five, tmp_path / "frontier.png")
    header = (tmp_path / "frontier.png").read_bytes()[16:24]
    width, height = int.from_bytes(header[:4], "big"), int.from_bytes(header[4:], "big")
    assert width <= 2100 and height > width / 2  # three columns, two rows
