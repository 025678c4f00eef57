"""`benchmarks team`'s report: one row per developer (coverage, p95, failures, cache share, where their
requests went), how fast each failed over and back, and each failed completion."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import orjson

from mellum_proxy.tuning.reporting.replay_report import developers_markdown
from mellum_proxy.tuning.reporting.results import Phase, PolicyResult


def failover_times(results: Sequence[PolicyResult], killed: float, back: float, local: str, router: str) -> list[str]:
    """Per developer: from the kill to its first request served by the local fallback, and from the
    router's return to its first request served by it again."""
    notes = []
    for r in results:
        served = [(at, upstream) for at, upstream, _, _ in r.upstream_series if upstream is not None]
        away = next((at for at, upstream in served if at >= killed and upstream == local), None)
        home = next((at for at, upstream in served if at >= back and upstream == router), None)
        local_count = sum(1 for at, upstream in served if upstream == local)
        to_local = "never" if away is None else f"{(away - killed) * 1000:.0f} ms after the kill"
        to_router = "never" if home is None else f"{(home - back) * 1000:.0f} ms after it was back"
        notes.append(f"{r.policy}: first answer from the local fallback {to_local}; first from the router "
                     f"again {to_router}; {local_count} answers from the fallback")  # fmt: skip
    return notes


def failures(results: Sequence[PolicyResult], events: dict[str, float]) -> list[str]:
    """Each failed completion, and whether it was in flight when the fault struck (it started before it
    and ended after it)."""
    faults = {what: at for what, at in events.items() if "killed" in what}
    notes = []
    for r in results:
        for at, _, outcome, total_ms in r.upstream_series:
            if outcome != "upstream_error":
                continue
            struck = [what for what, t in faults.items() if at <= t <= at + total_ms / 1000]
            when = f"in flight when {struck[0]}" if struck else "not in flight at a fault"
            notes.append(f"{r.policy}: failed completion at +{(at - events['replay start']) * 1000:.0f} ms, {when}")
    return notes or ["no failed completions"]


def team_report(phases: Sequence[Phase], command: str, notes: Sequence[str], out: Path) -> list[Path]:
    lines = [f"`{command}`", "", *[f"- {note}" for note in notes], ""]
    for phase in phases:
        lines += [f"## {phase.name} (`--policy {phase.router_policy}`)", ""]
        lines.append(developers_markdown(phase.results, phase.workers, phase.fallback))
        start = phase.events.get("replay start", 0.0)
        lines += [f"- {what} at +{(at - start) * 1000:.0f} ms" for what, at in phase.events.items() if at != start]
        lines += [f"- {note}" for note in phase.notes]
        lines.append("")
    (out / "report.md").write_text("\n".join(lines))
    body = {
        "command": command,
        "notes": list(notes),
        "phases": [{"name": p.name, "router_policy": p.router_policy, "workers": p.workers, "events": p.events,
                    "notes": p.notes, "developers": [r.summary() for r in p.results]} for p in phases],
    }  # fmt: skip
    (out / "results.json").write_bytes(orjson.dumps(body, option=orjson.OPT_INDENT_2))
    return [out / "report.md", out / "results.json"]
